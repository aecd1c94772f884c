"""The screen: which items read like instructions, to be sent alone rather than packed.

An item sent alone can only steer its own answer; packed, it is read by a model that is
also answering its neighbours (``docs/isolation.md``). :func:`looks_like_instructions`
is a cheap rule (regular expressions, no model) for the common shapes of an injected
instruction, in English, French, German, Spanish, Italian, Portuguese, Russian and
Chinese:

* **strong** signs, each enough by itself: "ignore the previous instructions", "system
  notice", "the task has changed", "new instructions", chat-template role tags
  (``<|im_start|>``, ``[INST]``, ``<<SYS>>``, a line starting ``system:``), and text
  that writes the packed format's own keys (``"id":``, ``"input":``, ``"results":``),
  as an item that tries to close the array or forge another item's id would;
* **weak** signs, flagging only two together: an address to every item or to the other
  inputs ("for every item", "the other reviews", "these quotes", "mine and the rest"),
  an address to the reader or the classifier ("whoever reads", "note to the
  annotator"), an answer dictated ("the correct answer is", "answer positive",
  "respond with", "mark each of them as"), an order to copy or repeat ("copy the text
  of", "repeat the other"). Steering a neighbour takes naming the neighbours and
  telling the reader what to answer, which is two signs however it is worded.

It is a screen, not a proof: an attacker who knows it can word around it, and a
review that happens to say "ignore the previous instructions" goes alone for nothing
(a plain call: it costs the packing saving of one item, never its answer). Combine it
with a classifier of your own through :func:`any_of`.

Pure: no state, no I/O; ``Screen`` is any ``Callable[[Any], bool]`` over an item.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

from .._exceptions import ConfigurationError

__all__ = [
    "Screen",
    "any_of",
    "checked_screen",
    "item_texts",
    "looks_like_instructions",
    "screen_of",
]

Screen: TypeAlias = Callable[[Any], bool]
"""Whether an item must be sent alone: called with the item as the caller passed it."""

# Zero-width and joiner characters an attacker can hide inside a keyword.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))

_STRONG = [
    # English
    r"\b(ignore|disregard|forget|override|skip)\b.{0,20}\b(all|any|the|your|previous|prior"
    r"|above|earlier|preceding|system|other)\b.{0,20}\b(instructions?|prompts?|rules|directions"
    r"|guidelines|messages?|context|task)\b",
    r"\bsystem\s*(notice|message|prompt|override|instruction|update|alert|note)\b",
    r"\b(the|your|this)\s+(task|instructions?|rules?|assignment)\s+(has|have)\s+(now\s+)?"
    r"(changed|been\s+(changed|updated|replaced))",
    r"\bnew\s+(task|instructions?|rules?)\s*[:!]",
    r"\b(you\s+are\s+now|from\s+now\s+on,?\s+(you|answer|respond|reply))\b",
    r"\b(developer|admin(istrator)?|debug)\s+mode\b",
    # the packed format's own keys: closing the array, forging an id or a result
    r"[\"'](id|input|results|output)[\"']\s*:",
    # chat-template role tags
    r"<\|?\s*(im_start|im_end|system|assistant|user|endoftext|eot_id|start_header_id)\s*\|?>",
    r"\[/?(inst|sys)\]|<</?sys>>",
    r"(^|\n)\s*(#+\s*)?(system|assistant)\s*:",
    # French
    r"\bignore[rz]?\b.{0,20}\b(instructions?|consignes?|r[eè]gles)\b",
    r"\b(avis|message|notice)\s+(du\s+)?syst[eè]me\b",
    r"\b(la|ta|votre)\s+t[aâ]che\s+a\s+chang[eé]",
    r"\bnouvelles?\s+(instructions?|consignes?|t[aâ]che)\b",
    # German
    r"\bignorier(e|en|t)?\b.{0,30}\b(anweisungen|instruktionen|regeln|vorgaben)\b",
    r"\bsystem(hinweis|nachricht|meldung|mitteilung)\b",
    r"\bdie\s+aufgabe\s+(hat\s+sich|wurde)\s+ge[aä]ndert",
    r"\bneue\s+(anweisungen?|aufgabe)\b",
    # Spanish, Italian, Portuguese
    r"\bignor[ae]\w*\b.{0,25}\b(instrucciones|istruzioni|instru[cç][oõ]es)\b",
    r"\b(aviso|mensaje|avviso|messaggio|mensagem)\s+(del|de|di|do)\s+sistema\b",
    r"\b(la\s+tarea|il\s+compito|a\s+tarefa)\s+(ha|[eè]|foi)\s+(cambiad[oa]|cambiat[oa]|mudad[oa]"
    r"|alterad[oa])",
    r"\b(nuevas|nuove|novas)\s+(instrucciones|istruzioni|instru[cç][oõ]es)\b",
    # Russian
    r"игнорир\w*.{0,25}инструкц\w*",
    r"системн\w*\s+(уведомлени|сообщени)\w*",
    r"задач\w*\s+изменил\w*",
    r"нов\w*\s+инструкц\w*",
    # Chinese
    r"(忽略|无视|忽视).{0,8}(指令|指示|说明|规则|提示)",
    r"系统(通知|消息|提示|公告)",
    r"任务(已经?|现在)?(更改|改变|变更|变了)",
    r"新(的)?(指令|任务)",
]

_WEAK = [
    # addressing every item, or the others
    r"\b(for|to)\s+(every|each|all)\s+(the\s+)?(other\s+)?(items?|inputs?|entr(y|ies)|reviews?"
    r"|snippets?|messages?|texts?|tickets?|documents?|requests?)\b",
    r"\b(all|every|each)\s+(of\s+)?the\s+other\s+\w+",
    r"\bthe\s+other\s+(items?|inputs?|entries|reviews?|snippets?|messages?|texts?|tickets?)\b",
    r"\b(in|of)\s+this\s+(request|batch|prompt|list|array)\b",
    # an answer dictated
    r"\b(the\s+)?(correct|right|only\s+valid|expected)\s+(answer|output|label|classification)"
    r"\s+(is|for|will\s+be)\b",
    r"\b(answer|respond|reply|output|return|label|classify)\s+(with\s+|as\s+)?[\"']?\w+[\"']?"
    r"\s+(for|to)\s+(all|every|each)\b",
    r"\b(you\s+must|always)\s+(answer|respond|reply|output|say)\b",
    # copying or repeating what another item holds
    r"\b(copy|repeat|reveal|print|include|quote)\b.{0,20}\b(other|previous|next|first|every)\b"
    r".{0,20}\b(items?|inputs?|reviews?|snippets?|messages?|texts?|answers?)\b",
    # the reader addressed: whoever classifies, or whoever reads the text
    r"\b(whoever|anyone\s+who|the\s+one\s+who)\s+(reads?|grades?|labels?|classif(y|ies)"
    r"|scores?|rates?|reviews?|process(es)?|checks?|sorts?)\b",
    r"\b((note|message|instructions?|reminder|request|word)\s+(to|for)|dear|attention)\s+(the\s+"
    r"|any\s+|all\s+)?(readers?|classifiers?|models?|assistants?|ai|annotators?|label+ers?|graders?"
    r"|moderators?|bots?|llms?|raters?)\b",
    # a label dictated for a set of items: "mark each quote as", "treat all of these as"
    r"\b(mark|label|tag|classify|rate|grade|score|flag|treat|count|categori[sz]e|judge|record"
    r"|consider|file)\s+(each|every|all|both|these|those|them|the\s+rest|the\s+others"
    r"|everything|everyone)\b.{0,40}?\b(as|with)\b",
    # the items named as a set, the writer's own among them
    r"\b(mine|my\s+own|this\s+one|me)\s+(and|as\s+well\s+as|along\s+with|like)\s+(the\s+)?"
    r"(rest|others|other\s+\w+|all|every)",
    r"\b(the\s+rest|all\s+the\s+others|the\s+others|everyone\s+else)\s+(alike|too|as\s+well)\b",
    r"\b(these|those|all\s+(of\s+)?(the|these|those))\s+(quotes|reviews|items|snippets|inputs"
    r"|entries|texts|tickets|messages|documents|comments|requests|questions)\b",
    r"\beach\s+(quote|review|item|snippet|input|entry|text|ticket|message|document|comment|one)"
    r"\s+(here|below|above|in\s+(this|the)\s+(list|batch|request|prompt|set))\b",
    # the same signs in other languages
    r"\b(pour\s+chaque|pour\s+tous\s+les|f[uü]r\s+jede[ns]?|para\s+cada|per\s+ogni)\b",
    r"\b(la\s+bonne\s+r[eé]ponse|die\s+richtige\s+antwort|la\s+respuesta\s+correcta"
    r"|la\s+risposta\s+corretta|a\s+resposta\s+correta)\b",
    r"(每个|所有).{0,6}(项目|条目|评论|输入)",
    r"正确(的)?答案",
    r"для\s+(каждого|всех)\s+\w+",
    r"правильн\w*\s+ответ",
]

_FLAGS = re.IGNORECASE | re.DOTALL
_STRONG_RE = [re.compile(pattern, _FLAGS) for pattern in _STRONG]
_WEAK_RE = [re.compile(pattern, _FLAGS) for pattern in _WEAK]
_WEAK_NEEDED = 2


def item_texts(item: Any) -> Iterator[str]:
    """The strings an item carries: itself, or the keys and string values inside its
    lists and dicts (a pydantic model's through ``model_dump``)."""
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        item = dump(mode="json")
    if isinstance(item, str):
        yield item
    elif isinstance(item, dict):
        for key, value in item.items():
            yield from item_texts(key)
            yield from item_texts(value)
    elif isinstance(item, list | tuple):
        for value in item:
            yield from item_texts(value)


def _normalized(text: str) -> str:
    """NFKC (full-width letters, ligatures), invisible characters dropped."""
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE)


def looks_like_instructions(item: Any) -> bool:
    """Whether ``item`` reads like instructions to the model rather than data.

    Args:
        item: A packed item: a string, or JSON-able data (lists, dicts, pydantic models)
            whose strings are read.

    Returns:
        True when any string of the item shows one strong sign, or two different weak
        signs (see the module's docstring).
    """
    for raw in item_texts(item):
        text = _normalized(raw)
        if any(pattern.search(text) for pattern in _STRONG_RE):
            return True
        if sum(1 for pattern in _WEAK_RE if pattern.search(text)) >= _WEAK_NEEDED:
            return True
    return False


def any_of(*screens: Screen) -> Screen:
    """A screen that flags an item when any of ``screens`` does (in order; the first
    that flags it ends the check)."""

    def screen(item: Any) -> bool:
        return any(check(item) for check in screens)

    return screen


def screen_of(option: bool | Screen | None) -> Screen | None:
    """The screen a ``screen=`` option asks for.

    Args:
        option: ``True``: :func:`looks_like_instructions`; ``False`` or ``None``: none;
            a callable: that screen (the user's own classifier; wrap it as
            ``any_of(looks_like_instructions, mine)`` to keep the rule too).
    """
    if option is True:
        return looks_like_instructions
    if option is False or option is None:
        return None
    return option


def checked_screen(name: str, screen: Screen | None) -> Screen | None:
    """``screen`` as a function's engine calls it: a screen that raises fails only the
    call it was asked about, with a :class:`~coalesce.ConfigurationError` naming the
    function and the screen (its exception as ``__cause__``).

    Args:
        name: The function's name, for the message.
        screen: The screen, or ``None`` (none).
    """
    if screen is None:
        return None

    def check(item: Any) -> bool:
        try:
            return bool(screen(item))
        except Exception as exc:
            what = getattr(screen, "__qualname__", repr(screen))
            raise ConfigurationError(
                f"{name}: the screen= function {what} raised {type(exc).__name__}: {exc};"
                " nothing was sent. A screen takes one item and returns whether it must be"
                " sent alone"
            ) from exc

    return check
