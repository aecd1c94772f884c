"""The screen: which items read like instructions, to be sent alone rather than packed.

:func:`looks_like_instructions` is a cheap rule (regular expressions, no model) for the
common shapes of an injected instruction, in eight languages: one **strong** sign
(:data:`STRONG_SIGNS`: "ignore the previous instructions", role tags, the packed
format's own keys...) or two **weak** ones together (:data:`WEAK_SIGNS`: an address to
the other items or to the reader, an answer dictated, an order to copy). Why, and what
it costs: ``docs/isolation.md``. Combine it with a classifier of your own through
:func:`any_of`.

Cheap on every call: a sign's pattern is searched only in a text holding the words it
cannot match without (:class:`Sign`), which flags exactly what searching every pattern
flags (``tests/wire/test_screen.py`` checks it). Pure: no state, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeAlias

from .._exceptions import ConfigurationError

__all__ = [
    "STRONG_SIGNS",
    "WEAK_SIGNS",
    "Screen",
    "Sign",
    "any_of",
    "checked_screen",
    "folded",
    "item_texts",
    "looks_like_instructions",
    "normalized",
    "screen_of",
    "shows_signs",
]

Screen: TypeAlias = Callable[[Any], bool]
"""Whether an item must be sent alone: called with the item as the caller passed it."""

# Zero-width and joiner characters an attacker can hide inside a keyword.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))

_FLAGS = re.IGNORECASE | re.DOTALL


class Sign(NamedTuple):
    """One sign of an instruction: its pattern, and the words it cannot match without.

    ``groups``: for each group, a text the pattern matches holds one of its words, on
    the text folded as :func:`folded` folds it: as a whole word (``exact``: a run of word
    characters) or anywhere (``within``). A text lacking every word of some group is not
    searched for the sign: it cannot match there, so skipping it changes nothing.
    """

    pattern: re.Pattern[str]
    groups: tuple[tuple[frozenset[str], tuple[str, ...]], ...]

    def possible(self, words: frozenset[str] | set[str], text: str) -> bool:
        """Whether the sign may match ``text`` (folded) whose words are ``words``."""
        for exact, within in self.groups:
            if words.isdisjoint(exact) and not any(word in text for word in within):
                return False
        return True


def _sign(pattern: str, *groups: str) -> Sign:
    """A sign: ``groups`` each as space-separated words, ``~`` before a word found
    anywhere rather than as a whole word (the most telling group first)."""
    parsed = []
    for group in groups:
        words = group.split()
        exact = frozenset(w for w in words if not w.startswith("~"))
        parsed.append((exact, tuple(w[1:] for w in words if w.startswith("~"))))
    return Sign(re.compile(pattern, _FLAGS), tuple(parsed))


_ORDERS = "instruction instructions rule rules"
_TASKS = "task " + _ORDERS
_ITEMS = "item items input inputs review reviews snippet snippets message messages text texts"
_ITALIAN_SPANISH = "instrucciones istruzioni instrucoes instruçoes instrucões instruções"

STRONG_SIGNS = (
    # English
    _sign(
        r"\b(ignore|disregard|forget|override|skip)\b.{0,20}\b(all|any|the|your|previous|prior"
        r"|above|earlier|preceding|system|other)\b.{0,20}\b(instructions?|prompts?|rules"
        r"|directions|guidelines|messages?|context|task)\b",
        "ignore disregard forget override skip",
    ),
    _sign(
        r"\bsystem\s*(notice|message|prompt|override|instruction|update|alert|note)\b", "~system"
    ),
    _sign(
        r"\b(the|your|this)\s+(task|instructions?|rules?|assignment)\s+(has|have)\s+(now\s+)?"
        r"(changed|been\s+(changed|updated|replaced))",
        "~changed been",
        _TASKS + " assignment",
        "has have",
    ),
    _sign(r"\bnew\s+(task|instructions?|rules?)\s*[:!]", "new", _TASKS, "~: ~!"),
    _sign(
        r"\b(you\s+are\s+now|from\s+now\s+on,?\s+(you|answer|respond|reply))\b", "now", "you from"
    ),
    _sign(
        r"\b(developer|admin(istrator)?|debug)\s+mode\b",
        "mode",
        "developer admin administrator debug",
    ),
    # the packed format's own keys: closing the array, forging an id or a result
    _sign(r"[\"'](id|input|results|output)[\"']\s*:", "id input results output", "~: ", "~\" ~'"),
    # chat-template role tags
    _sign(
        r"<\|?\s*(im_start|im_end|system|assistant|user|endoftext|eot_id|start_header_id)\s*\|?>",
        "~<",
        "im_start im_end system assistant user endoftext eot_id start_header_id",
    ),
    _sign(r"\[/?(inst|sys)\]|<</?sys>>", "inst sys", "~[ ~<"),
    _sign(r"(^|\n)\s*(#+\s*)?(system|assistant)\s*:", "system assistant", "~:"),
    # French
    _sign(
        r"\bignore[rz]?\b.{0,20}\b(instructions?|consignes?|r[eè]gles)\b",
        "ignore ignorer ignorez",
        "instruction instructions consigne consignes regles règles",
    ),
    _sign(
        r"\b(avis|message|notice)\s+(du\s+)?syst[eè]me\b", "systeme système", "avis message notice"
    ),
    _sign(r"\b(la|ta|votre)\s+t[aâ]che\s+a\s+chang[eé]", "tache tâche", "~change ~changé"),
    _sign(
        r"\bnouvelles?\s+(instructions?|consignes?|t[aâ]che)\b",
        "nouvelle nouvelles",
        "instruction instructions consigne consignes tache tâche",
    ),
    # German
    _sign(
        r"\bignorier(e|en|t)?\b.{0,30}\b(anweisungen|instruktionen|regeln|vorgaben)\b",
        "ignorier ignoriere ignorieren ignoriert",
        "anweisungen instruktionen regeln vorgaben",
    ),
    _sign(
        r"\bsystem(hinweis|nachricht|meldung|mitteilung)\b",
        "systemhinweis systemnachricht systemmeldung systemmitteilung",
    ),
    _sign(r"\bdie\s+aufgabe\s+(hat\s+sich|wurde)\s+ge[aä]ndert", "aufgabe", "die", "hat wurde"),
    _sign(r"\bneue\s+(anweisungen?|aufgabe)\b", "neue", "anweisunge anweisungen aufgabe"),
    # Spanish, Italian, Portuguese
    _sign(
        r"\bignor[ae]\w*\b.{0,25}\b(instrucciones|istruzioni|instru[cç][oõ]es)\b",
        _ITALIAN_SPANISH,
        "~ignora ~ignore",
    ),
    _sign(
        r"\b(aviso|mensaje|avviso|messaggio|mensagem)\s+(del|de|di|do)\s+sistema\b",
        "sistema",
        "aviso mensaje avviso messaggio mensagem",
    ),
    _sign(
        r"\b(la\s+tarea|il\s+compito|a\s+tarefa)\s+(ha|[eè]|foi)\s+(cambiad[oa]|cambiat[oa]"
        r"|mudad[oa]|alterad[oa])",
        "tarea compito tarefa",
    ),
    _sign(
        r"\b(nuevas|nuove|novas)\s+(instrucciones|istruzioni|instru[cç][oõ]es)\b",
        "nuevas nuove novas",
        _ITALIAN_SPANISH,
    ),
    # Russian
    _sign(r"игнорир\w*.{0,25}инструкц\w*", "~игнорир", "~инструкц"),
    _sign(r"системн\w*\s+(уведомлени|сообщени)\w*", "~системн", "~уведомлени ~сообщени"),
    _sign(r"задач\w*\s+изменил\w*", "~изменил", "~задач"),
    _sign(r"нов\w*\s+инструкц\w*", "~инструкц", "~нов"),
    # Chinese
    _sign(
        r"(忽略|无视|忽视).{0,8}(指令|指示|说明|规则|提示)",
        "~忽略 ~无视 ~忽视",
        "~指令 ~指示 ~说明 ~规则 ~提示",
    ),
    _sign(r"系统(通知|消息|提示|公告)", "~系统通知 ~系统消息 ~系统提示 ~系统公告"),
    _sign(r"任务(已经?|现在)?(更改|改变|变更|变了)", "~任务", "~更改 ~改变 ~变更 ~变了"),
    _sign(r"新(的)?(指令|任务)", "~指令 ~任务", "~新"),
)

WEAK_SIGNS = (
    # addressing every item, or the others
    _sign(
        r"\b(for|to)\s+(every|each|all)\s+(the\s+)?(other\s+)?(items?|inputs?|entr(y|ies)|reviews?"
        r"|snippets?|messages?|texts?|tickets?|documents?|requests?)\b",
        _ITEMS + " entry entries ticket tickets document documents request requests",
        "every each all",
        "for to",
    ),
    _sign(r"\b(all|every|each)\s+(of\s+)?the\s+other\s+\w+", "other", "all every each", "the"),
    _sign(
        r"\bthe\s+other\s+(items?|inputs?|entries|reviews?|snippets?|messages?|texts?|tickets?)\b",
        "other",
        _ITEMS + " entries ticket tickets",
        "the",
    ),
    _sign(
        r"\b(in|of)\s+this\s+(request|batch|prompt|list|array)\b",
        "request batch prompt list array",
        "this",
        "in of",
    ),
    # an answer dictated
    _sign(
        r"\b(the\s+)?(correct|right|only\s+valid|expected)\s+(answer|output|label|classification)"
        r"\s+(is|for|will\s+be)\b",
        "correct right valid expected",
        "answer output label classification",
        "is for will",
    ),
    _sign(
        r"\b(answer|respond|reply|output|return|label|classify)\s+(with\s+|as\s+)?[\"']?\w+[\"']?"
        r"\s+(for|to)\s+(all|every|each)\b",
        "answer respond reply output return label classify",
        "all every each",
        "for to",
    ),
    _sign(
        r"\b(you\s+must|always)\s+(answer|respond|reply|output|say)\b",
        "must always",
        "answer respond reply output say",
    ),
    # copying or repeating what another item holds
    _sign(
        r"\b(copy|repeat|reveal|print|include|quote)\b.{0,20}\b(other|previous|next|first|every)\b"
        r".{0,20}\b(items?|inputs?|reviews?|snippets?|messages?|texts?|answers?)\b",
        "copy repeat reveal print include quote",
        "other previous next first every",
        _ITEMS + " answer answers",
    ),
    # the reader addressed: whoever classifies, or whoever reads the text
    _sign(
        r"\b(whoever|anyone\s+who|the\s+one\s+who)\s+(reads?|grades?|labels?|classif(y|ies)"
        r"|scores?|rates?|reviews?|process(es)?|checks?|sorts?)\b",
        "whoever who",
        "read reads grade grades label labels classify classifies score scores rate rates"
        " review reviews process processes check checks sort sorts",
    ),
    _sign(
        r"\b((note|message|instructions?|reminder|request|word)\s+(to|for)|dear|attention)\s+(the\s+"
        r"|any\s+|all\s+)?(readers?|classifiers?|models?|assistants?|ai|annotators?|label+ers?|graders?"
        r"|moderators?|bots?|llms?|raters?)\b",
        "note message instruction instructions reminder request word dear attention",
        "reader readers classifier classifiers model models assistant assistants ai annotator"
        " annotators grader graders moderator moderators bot bots llm llms rater raters ~label",
    ),
    # a label dictated for a set of items: "mark each quote as", "treat all of these as"
    _sign(
        r"\b(mark|label|tag|classify|rate|grade|score|flag|treat|count|categori[sz]e|judge|record"
        r"|consider|file)\s+(each|every|all|both|these|those|them|the\s+rest|the\s+others"
        r"|everything|everyone)\b.{0,40}?\b(as|with)\b",
        "mark label tag classify rate grade score flag treat count categorise categorize judge"
        " record consider file",
        "each every all both these those them the everything everyone",
        "as with",
    ),
    # the items named as a set, the writer's own among them
    _sign(
        r"\b(mine|my\s+own|this\s+one|me)\s+(and|as\s+well\s+as|along\s+with|like)\s+(the\s+)?"
        r"(rest|others|other\s+\w+|all|every)",
        "mine my this me",
        "and as along like",
        "~rest ~other ~all ~every",
    ),
    _sign(
        r"\b(the\s+rest|all\s+the\s+others|the\s+others|everyone\s+else)\s+(alike|too|as\s+well)\b",
        "rest others else",
        "alike too as",
    ),
    _sign(
        r"\b(these|those|all\s+(of\s+)?(the|these|those))\s+(quotes|reviews|items|snippets|inputs"
        r"|entries|texts|tickets|messages|documents|comments|requests|questions)\b",
        "quotes reviews items snippets inputs entries texts tickets messages documents comments"
        " requests questions",
        "these those the",
    ),
    _sign(
        r"\beach\s+(quote|review|item|snippet|input|entry|text|ticket|message|document|comment|one)"
        r"\s+(here|below|above|in\s+(this|the)\s+(list|batch|request|prompt|set))\b",
        "each",
        "here below above in",
    ),
    # the same signs in other languages
    _sign(
        r"\b(pour\s+chaque|pour\s+tous\s+les|f[uü]r\s+jede[ns]?|para\s+cada|per\s+ogni)\b",
        "pour fur für para per",
    ),
    _sign(
        r"\b(la\s+bonne\s+r[eé]ponse|die\s+richtige\s+antwort|la\s+respuesta\s+correcta"
        r"|la\s+risposta\s+corretta|a\s+resposta\s+correta)\b",
        "bonne richtige respuesta risposta resposta",
    ),
    _sign(r"(每个|所有).{0,6}(项目|条目|评论|输入)", "~每个 ~所有", "~项目 ~条目 ~评论 ~输入"),
    _sign(r"正确(的)?答案", "~正确", "~答案"),
    _sign(r"для\s+(каждого|всех)\s+\w+", "~для", "~каждого ~всех"),
    _sign(r"правильн\w*\s+ответ", "~правильн", "~ответ"),
)

_WEAK_NEEDED = 2
_WORD = re.compile(r"\w+")

#: The letters that case-insensitive matching equates with another besides by their
#: lower case (Python's ``re`` adds these pairs to Unicode's simple lower-case mapping),
#: and the capital dotted I, whose lower case in ``str.lower`` is two characters: each
#: folded to the letter ``re.IGNORECASE`` matches it with. (NFKC has already folded the
#: long s and the like; it is here for text that was not normalized.)
_CASE_FOLD = str.maketrans(
    {
        "\u0131": "i",  # dotless i
        "\u0130": "i",  # capital I with a dot
        "\u017f": "s",  # long s
        "\u1c80": "\u0432",  # the Cyrillic letters' rounded and tall forms: ve,
        "\u1c81": "\u0434",  # de,
        "\u1c82": "\u043e",  # o,
        "\u1c83": "\u0441",  # es,
        "\u1c84": "\u0442",  # te,
        "\u1c85": "\u0442",  # te,
        "\u1c86": "\u044a",  # hard sign,
        "\u1c87": "\u0463",  # yat,
        "\u1c88": "\ua64b",  # monograph uk
        "\u1e9b": "\u1e61",  # long s with a dot
    }
)


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


def normalized(text: str) -> str:
    """NFKC (full-width letters, ligatures), invisible characters dropped (ASCII text
    is both already)."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE)


def folded(text: str) -> str:
    """``text`` (normalized) in lower case, each letter as case-insensitive matching
    reads it: a word of a :class:`Sign` is in the folded text wherever its pattern
    matches the text. Character for character, so the words (runs of word characters) stay."""
    if text.isascii():
        return text.lower()
    return text.translate(_CASE_FOLD).lower()


def _anchors(signs: tuple[Sign, ...]) -> tuple[dict[str, list[int]], list[tuple[str, int]]]:
    """Which signs each word of their first group points to: by whole word, and by the
    words found anywhere (those of ASCII text first)."""
    exact: dict[str, list[int]] = {}
    within: list[tuple[str, int]] = []
    for index, sign in enumerate(signs):
        words, anywhere = sign.groups[0]
        for word in words:
            exact.setdefault(word, []).append(index)
        within += [(word, index) for word in anywhere]
    within.sort(key=lambda pair: not pair[0].isascii())
    return exact, within


_SIGNS = STRONG_SIGNS + WEAK_SIGNS
_EXACT, _WITHIN = _anchors(_SIGNS)
_ASCII_WITHIN = [pair for pair in _WITHIN if pair[0].isascii()]


def _candidates(words: set[str], low: str) -> list[int]:
    """The signs (indexes into :data:`_SIGNS`) whose first group ``low`` holds a word of,
    in order: the only ones that may match."""
    found = {index for word in _EXACT.keys() & words for index in _EXACT[word]}
    for word, index in _ASCII_WITHIN if low.isascii() else _WITHIN:
        if word in low:
            found.add(index)
    return sorted(found)


def shows_signs(text: str) -> bool:
    """Whether ``text`` (normalized) shows one strong sign or two weak ones.

    Only the signs whose words ``text`` holds are searched for (see :class:`Sign`).
    """
    low = folded(text)
    words = set(_WORD.findall(low))
    weak = 0
    for index in _candidates(words, low):
        sign = _SIGNS[index]
        if sign.possible(words, low) and sign.pattern.search(text):
            if index < len(STRONG_SIGNS):
                return True
            weak += 1
            if weak == _WEAK_NEEDED:
                return True
    return False


def looks_like_instructions(item: Any) -> bool:
    """Whether ``item`` reads like instructions to the model rather than data.

    Args:
        item: A packed item: a string, or JSON-able data (lists, dicts, pydantic models)
            whose strings are read.

    Returns:
        True when any string of the item shows one strong sign, or two different weak
        signs (see the module's docstring).
    """
    return any(shows_signs(normalized(raw)) for raw in item_texts(item))


def any_of(*screens: Screen) -> Screen:
    """A screen that flags an item when any of ``screens`` does (in order; the first
    that flags it ends the check)."""

    def screen(item: Any) -> bool:
        return any(check(item) for check in screens)

    return screen


def screen_of(option: bool | Screen | None) -> Screen | None:
    """The screen a ``screen=`` option asks for: ``True``, :func:`looks_like_instructions`;
    ``False`` or ``None``, none; a callable, that screen (the user's own classifier;
    ``any_of(looks_like_instructions, mine)`` keeps the rule too)."""
    if option is True:
        return looks_like_instructions
    if option is False or option is None:
        return None
    return option


def checked_screen(name: str, screen: Screen | None) -> Screen | None:
    """``screen`` (or ``None``) as a function's engine calls it: a screen that raises fails
    only the call it was asked about, with a :class:`~coalesce.ConfigurationError` naming
    the function and the screen (its exception as ``__cause__``)."""
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
