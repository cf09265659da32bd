"""Why a vLLM server did not start, in one line: its cause and what to do, read from its log.

vLLM reports a failed start as a traceback of 50 to 300 lines, often several (the worker's,
then the engine core's, then the API server's wrapper "Engine core initialization failed. See
root cause above."). :func:`diagnose` finds the cause in that text: first the failures a user
meets most (port in use, a model that is not on the machine, a context longer than the model's,
too much memory asked for, a bad flag), each with what to do about it; then, for anything else,
the last exception that is not one of vLLM's wrappers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from envhub.defaults import DEFAULT_MODEL

_PREFIX = re.compile(r"^\((?:[\w .-]+) pid=\d+\)\s+(?:\w+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s?)?")
"""vLLM's per-process log prefix: ``(EngineCore pid=12) ERROR 11-27 23:30:17 [core.py:1510] ``."""

_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w+(?:Error|Exception|Exit)): (.+)$")
_WRAPPERS = ("Engine core initialization failed", "EngineCore failed to start", "See root cause")

SMALL_MODEL = DEFAULT_MODEL
"""The model the set-up (scripts/install.sh) puts on the machine, for remedies to name."""


@dataclass(frozen=True)
class StartFailure:
    """Why a server did not start (``cause``) and what to do about it (``remedy``)."""

    cause: str
    remedy: str

    def line(self) -> str:
        """``cause — remedy``: the one line a command ends with."""
        return f"{self.cause} — {self.remedy}"


@dataclass(frozen=True)
class Launch:
    """What the failed server was asked for, for causes and remedies to name."""

    model: str
    host: str
    port: int


def log_lines(text: str) -> list[str]:
    """The log's lines without vLLM's per-process prefixes, blank ones dropped."""
    return [s for s in (_PREFIX.sub("", line).rstrip() for line in text.splitlines()) if s]


def start_failed(log_tail: str) -> bool:
    """Whether the end of a log says the engine failed to start (the API server says so before
    it exits)."""
    return "Engine core initialization failed" in log_tail


def diagnose(log_text: str, launch: Launch) -> StartFailure:
    """The cause of a failed start found in ``log_text`` (the server's whole log), with a
    remedy; a generic one ("read the full log") when no known failure matches."""
    lines = log_lines(log_text)
    text = "\n".join(lines)
    for rule in _RULES:
        found = rule(text, launch)
        if found is not None:
            return found
    return StartFailure(_last_exception(lines) or _last_line(lines), "the full log says more")


def _port_in_use(text: str, launch: Launch) -> StartFailure | None:
    if "Address already in use" not in text:
        return None
    return StartFailure(
        f"port {launch.port} on {launch.host} is already in use",
        "stop what listens there, or pick another port (--port)",
    )


def _model_not_here(text: str, launch: Launch) -> StartFailure | None:
    markers = (
        "LocalEntryNotFoundError",
        "couldn't connect to 'https://huggingface.co'",
        "RepositoryNotFoundError",
        "is not a local folder and is not a valid model identifier",
        "Repo id must be in the form",  # a path that does not exist, read as a Hub id
    )
    if not any(m in text for m in markers):
        return None
    return StartFailure(
        f"model {launch.model!r} is not on this machine and could not be downloaded",
        f"give a local model folder or {SMALL_MODEL} (installed by the set-up), "
        f"or download it first with `hf download {launch.model}` where the Hub is reachable",
    )


def _context_too_long(text: str, launch: Launch) -> StartFailure | None:
    found = re.search(
        r"max_model_len \((\d+)\) is greater than the derived max_model_len "
        r"\(max_position_embeddings=([\d.]+)",
        text,
    )
    if found is None:
        return None
    asked, limit = found.group(1), int(float(found.group(2)))
    return StartFailure(
        f"--max-model-len {asked} is longer than the model's {limit} positions",
        f"give --max-model-len {limit} or less (or leave it out: the default fits the model)",
    )


def _cpu_kv_cache_too_big(text: str, launch: Launch) -> StartFailure | None:
    found = re.search(
        r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\).*?requested memory for kv "
        r"\(([\d.]+)(?:/[\d.]+)? GiB\)",
        text,
    )
    if found is None:
        return None
    free, asked = found.group(1), found.group(3)
    return StartFailure(
        f"the KV cache asked for ({asked} GiB) does not fit in the {free} GiB of free memory",
        "set VLLM_CPU_KVCACHE_SPACE to fewer GiB (envhub's default is 2), or free memory",
    )


def _cpu_memory_share(text: str, launch: Launch) -> StartFailure | None:
    """vLLM's CPU backend without VLLM_CPU_KVCACHE_SPACE reserves ``--gpu-memory-utilization``
    (0.92 by default in vLLM 0.32) of the memory: on a machine with other work, more than is
    free."""
    found = re.search(
        r"Available memory on node \d+ \(([\d.]+)/[\d.]+ GiB\) on startup is less than desired "
        r"CPU memory utilization \(([\d.]+), ([\d.]+) GiB\)",
        text,
    )
    if found is None:
        return None
    free, share, asked = found.groups()
    return StartFailure(
        f"vLLM's CPU backend would reserve {share} of memory ({asked} GiB) and {free} GiB is free",
        "set VLLM_CPU_KVCACHE_SPACE=2 (GiB of KV cache; envhub's servers set it), or lower "
        "--gpu-memory-utilization (on a CPU, the share of memory vLLM reserves)",
    )


def _gpu_memory(text: str, launch: Launch) -> StartFailure | None:
    if re.search(r"CUDA out of memory|OutOfMemoryError", text):
        cause = "the GPU ran out of memory while the engine started"
    else:
        found = re.search(r"Free memory on device .*? is less than desired GPU memory.*", text)
        if found is None:
            return None
        cause = found.group(0).split(". Decrease")[0].rstrip(".")
    return StartFailure(
        cause,
        "lower --gpu-memory-utilization or --max-model-len, or stop what else uses the GPU "
        "(nvidia-smi lists it)",
    )


def _no_memory_for_cache(text: str, launch: Launch) -> StartFailure | None:
    more = "more KV cache memory: VLLM_CPU_KVCACHE_SPACE (GiB) on a CPU, --gpu-memory-utilization"
    if "No available memory for the cache blocks" in text:
        return StartFailure(
            "the model's weights leave no memory for the KV cache", f"give vLLM {more} on a GPU"
        )
    found = re.search(
        r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the "
        r"available KV cache memory \(([\d.]+) GiB\)",
        text,
    )
    if found is None:
        return None
    length, needed, available = found.groups()
    estimate = re.search(r"the estimated maximum model length is (\d+)", text)
    fits = (
        f"--max-model-len {estimate.group(1)} or less" if estimate else "a smaller --max-model-len"
    )
    return StartFailure(
        f"a {length}-token context needs {needed} GiB of KV cache and {available} GiB is there",
        f"give {fits}, or {more} on a GPU",
    )


_SEE_HELP = "fix that flag (`python -m vllm.entrypoints.openai.api_server --help` lists them)"


def _bad_flag(text: str, launch: Launch) -> StartFailure | None:
    found = re.search(r"^[\w.]+: error: (.+)$", text, re.MULTILINE)
    if found is None:
        return None
    return StartFailure(f"vLLM refused its arguments: {found.group(1)}", _SEE_HELP)


def _unknown_architecture(text: str, launch: Launch) -> StartFailure | None:
    found = re.search(r"has model type `([^`]+)` but Transformers does not recognize", text)
    if found is None:
        return None
    return StartFailure(
        f"model {launch.model!r} is of type {found.group(1)!r}, which neither this vLLM nor "
        "its Transformers knows",
        "check the model folder's config.json, or upgrade transformers and vllm "
        "if the architecture is new",
    )


def _invalid_setting(text: str, launch: Launch) -> StartFailure | None:
    """A pydantic validation error of vLLM's config: the field, then why."""
    found = re.search(
        r"ValidationError: \d+ validation errors? for (\w+)\n(?:  Value error, (.+?)|(\w+)\n"
        r"\s+(.+?))(?: \[type=|\n|$)",
        text,
    )
    if found is None:
        return None
    config, value_error, field, why = found.groups()
    if value_error:
        return StartFailure(f"vLLM refused its {config}: {value_error}".rstrip("."), _SEE_HELP)
    flag = "--" + field.replace("_", "-")
    return StartFailure(f"{flag}: {why}".rstrip("."), f"give {flag} a valid value")


_RULES: tuple[Callable[[str, Launch], StartFailure | None], ...] = (
    _port_in_use,
    _model_not_here,
    _context_too_long,
    _cpu_kv_cache_too_big,
    _cpu_memory_share,
    _gpu_memory,
    _no_memory_for_cache,
    _bad_flag,
    _unknown_architecture,
    _invalid_setting,
)


def _last_exception(lines: list[str]) -> str | None:
    for line in reversed(lines):
        found = _EXCEPTION.match(line.strip())
        if found and not any(w in found.group(2) for w in _WRAPPERS):
            return f"{found.group(1)}: {found.group(2)}"
    return None


def _last_line(lines: list[str]) -> str:
    return lines[-1].strip() if lines else "vLLM exited without writing a log line"
