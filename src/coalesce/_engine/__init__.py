"""One LLM function's calls: taking them in (the engine), asking for a group (the
group runner, its retries and re-asks), and what a function is (``FunctionSpec``,
``Options``)."""
