"""Keyword and format stuffing: replies built from the words, markers and formats that the
reward's own code, the env's reply logic, the prompt and the system prompt contain.

:func:`reward_literals` reads the string literals (and regular expressions) of every reward
function of the env's rubric, of the env's own methods (a multi-turn env reads replies in
``env_response``), and of the functions and patterns those use, a few calls deep.
:func:`stuffing_policy` turns them into one reply: every tag pair and LaTeX command found, with
junk inside; a sample of every regular expression that matches without a digit (one that needs
a digit reads a number: a wrong answer, not stuffing); a ``Label: junk`` line for every
``Label:`` marker; then the bag of every word. :func:`keywords_policy` writes the bag of words
alone, for rewards that pay for keywords but not for markup. Docstrings are prose, not what
the code looks for, and stay out; so do the options the prompt offers by name (``left``,
``down``): a bag that names one is a move, which wins a slippery game by luck
(:mod:`envhub.audit.hedging` lists them all at once, between junk).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from typing import Any

from envhub.audit.basic import JUNK, NOT_ANSWER_TAGS, shown_text
from envhub.audit.hedging import prompt_options
from envhub.env import Env
from envhub.testing import Policy
from envhub.types import Message

try:  # the parser behind `re`, to write a string that a pattern matches
    from re import _parser as _sre_parser  # type: ignore[attr-defined]  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser  # type: ignore[no-redef]

MAX_WORDS = 200
"""The bag of words is cut to this many distinct words."""
DEPTH = 3
"""How many calls deep :func:`reward_literals` follows the functions a reward uses."""
_FRAMEWORK = (
    "envhub.env", "envhub.multiturn", "envhub.workspace_env", "envhub.harness", "envhub.serve",
    "envhub.adapters",
    "gymnasium", "builtins",
)  # fmt: skip
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{2,}")
_TAG = re.compile(r"</?([A-Za-z][\w-]*)>")
_LATEX = re.compile(r"\\+([A-Za-z]+)\s*\\*\{")
_LABEL = re.compile(r"(?m)^\s*([A-Z][A-Za-z ]{1,24}):")
_REGEX_HINT = re.compile(r"\\[dswDSWb]|\(\?|\.\*|\.\+|\[[^\]]+\]|\\[{}()\[\].*+?]")


def reward_literals(env: Env) -> list[str]:
    """The string literals and pattern sources of the env's reward functions, of its own
    methods, and of what they call (:data:`DEPTH` deep), in order, without repeats."""
    seen: set[int] = set()
    literals: list[str] = []
    for fn in _roots(env):
        try:
            literals += _walk(fn, DEPTH, seen)
        except Exception:  # user code in odd shapes (a global that raises on access): skip it
            continue
    return list(dict.fromkeys(literals))


def _roots(env: Env) -> Iterator[Any]:
    rubric = getattr(env, "rubric", None)
    for func in getattr(rubric, "funcs", ()):
        yield func.fn
    for cls in type(env).__mro__:
        if cls is object or _framework(cls.__module__):
            continue
        for value in vars(cls).values():
            fn = getattr(value, "__func__", value)
            if isinstance(fn, types.FunctionType):
                yield fn


def _framework(module: str) -> bool:
    """True for envhub's own machinery (``envhub.env``, not ``envhub.envs.arithmetic``)."""
    return any(module == name or module.startswith(f"{name}.") for name in _FRAMEWORK)


def _walk(fn: Any, depth: int, seen: set[int]) -> list[str]:
    """The literals of ``fn``'s source and of the globals and closure cells it refers to."""
    if id(fn) in seen or depth < 0 or not isinstance(fn, types.FunctionType):
        return []
    if (fn.__module__ or "").partition(".")[0] in sys.stdlib_module_names:
        return []  # the standard library's literals say nothing about this reward
    seen.add(id(fn))
    found = _source_literals(fn)
    for value in _referenced(fn):
        if isinstance(value, re.Pattern):
            found.append(value.pattern if isinstance(value.pattern, str) else "")
        elif isinstance(value, str):
            found.append(value)
        elif isinstance(value, types.FunctionType):
            found += _walk(value, depth - 1, seen)
        elif isinstance(_wrapped(value), types.FunctionType):  # a RewardFunction
            found += _walk(value.fn, depth - 1, seen)
    return found


def _wrapped(value: Any) -> Any:
    """``value.fn`` (a RewardFunction's function), or None; a global that raises on any
    attribute (a lazy proxy, say) has none."""
    try:
        return getattr(value, "fn", None)
    except Exception:
        return None


def _source_literals(fn: types.FunctionType) -> list[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source (built in a REPL, say)
        return [c for c in _constants(fn.__code__) if isinstance(c, str)]
    docstrings = {id(d) for d in _docstrings(tree)}
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def _docstrings(tree: ast.AST) -> Iterator[ast.Constant]:
    """The docstring nodes of ``tree``: prose about the code, not what the code looks for."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                yield body[0].value


def _constants(code: types.CodeType) -> Iterator[Any]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _constants(const)
        else:
            yield const


def _referenced(fn: types.FunctionType) -> Iterator[Any]:
    """The globals ``fn`` (and the functions nested in it) names, and its closure's values."""
    names: set[str] = set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in sorted(names):
        if name in fn.__globals__:
            yield fn.__globals__[name]
    for cell in fn.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


def regex_sample(pattern: str) -> str | None:
    """A short string ``pattern`` matches, with junk where it allows any text; ``None`` when
    the pattern needs a digit (it reads a number), cannot be sampled, or is no pattern."""
    try:
        with warnings.catch_warnings():  # literals that are not patterns may warn (nested sets)
            warnings.simplefilter("ignore")
            compiled = re.compile(pattern)
            sample = _sample(_sre_parser.parse(pattern))
    except (re.error, _NeedsDigit, RecursionError, TypeError, ValueError):
        return None
    return sample if sample and compiled.search(sample) else None


class _NeedsDigit(Exception):
    """The pattern reads a number here: its sample would be an answer, not stuffing."""


_CATEGORY = {"CATEGORY_SPACE": " ", "CATEGORY_WORD": "j", "CATEGORY_NOT_DIGIT": "j"}


def _sample(parsed: Any) -> str:
    out = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "ANY":
            out.append("j")
        elif name == "NOT_LITERAL":
            out.append("k" if arg == ord("j") else "j")
        elif name == "IN":
            out.append(_one_of(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, item = arg
            count = min(max(low, 4), high) if _wants_text(item) else low
            out.append(_sample(item) * count if count else "")
        elif name == "SUBPATTERN":
            out.append(_sample(arg[-1]))
        elif name == "BRANCH":
            out.append(_sample(arg[1][0]))
        elif name not in ("AT", "ASSERT", "ASSERT_NOT"):  # back-references, conditionals
            raise ValueError(name)
    return "".join(out)


def _wants_text(item: Any) -> bool:
    """True for a repeat of any character or of a plain set: ``.*`` gets ``jjjj``, not nothing."""
    if len(item) != 1:
        return False
    op, arg = item[0]
    return str(op) == "ANY" or (str(op) == "IN" and all(str(o) != "NEGATE" for o, _ in arg))


def _one_of(items: Any) -> str:
    """A character of a ``[...]`` set: one that is not a digit when the set has one."""
    if any(str(op) == "NEGATE" for op, _ in items):
        return (
            "j" if not any(str(op) == "CATEGORY" and "WORD" in str(a) for op, a in items) else " "
        )
    chars = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            chars.append(chr(arg))
        elif name == "RANGE":
            chars.append(chr(arg[0]))
        elif name == "CATEGORY":
            chars.append(_CATEGORY.get(str(arg), "0"))
    letters = [c for c in chars if not c.isdigit()]
    if letters:
        return letters[0]
    raise _NeedsDigit()


def _markers(texts: list[str]) -> list[str]:
    """Every tag pair, LaTeX command and ``Label:`` marker in ``texts``, with junk inside,
    then a sample of every regular expression among them."""
    markers: list[str] = []
    for text in texts:
        markers += [
            f"<{t}>{JUNK}</{t}>" for t in _TAG.findall(text) if t.lower() not in NOT_ANSWER_TAGS
        ]
        markers += [f"\\{cmd}{{{JUNK}}}" for cmd in _LATEX.findall(text)]
        markers += [f"{label.strip()}: {JUNK}" for label in _LABEL.findall(text)]
        if _REGEX_HINT.search(text):
            sample = regex_sample(text)
            markers += [sample] if sample else []
    return list(dict.fromkeys(markers))


def bag_of_words(texts: list[str], leave_out: list[str] = ()) -> str:
    """The distinct words (three letters or more) of ``texts``, in order, at most
    :data:`MAX_WORDS`, separated by spaces, without those of ``leave_out``."""
    left_out = {w.lower() for w in leave_out}
    words = dict.fromkeys(w.lower() for text in texts for w in _WORD.findall(text))
    return " ".join([w for w in words if w not in left_out][:MAX_WORDS])


def keywords_policy(env: Env) -> Policy:
    """Every word of the reward's code, the env's logic, the system prompt and the prompt."""
    literals = reward_literals(env)

    def keywords(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        return bag_of_words([*literals, shown_text(messages)], prompt_options(messages))

    return keywords


def stuffing_policy(env: Env) -> Policy:
    """Every marker and format of the reward's code and the prompts with junk inside, then
    every word of them (see the module docstring)."""
    literals = reward_literals(env)

    def stuffed(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        texts = [*literals, shown_text(messages)]
        return "\n".join([*_markers(texts), bag_of_words(texts, prompt_options(messages))])

    return stuffed
