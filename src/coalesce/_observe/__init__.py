"""What is told about calls: the statistics recorder, events and their log lines,
OpenTelemetry, and the group runner's listeners that feed them."""
