"""One vLLM server's control routes over HTTP (vLLM serves them in dev mode only).

Weight transfer (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/get_world_size``) and the engine's state around a sync
(``/reset_prefix_cache``, ``/sleep``, ``/wake_up``). The driver's ``ServerTransport`` and a
trainer rank that sends itself talk to the server through the same class, so a route, a body
or an error message is written once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from envhub.errors import EngineError, EngineUnavailableError


class VLLMRoutes:
    """The control routes of the server at ``url`` (a :class:`~.plan.WeightReceiver`).

    Args:
        url: The server's base URL (``http://host:port``, without ``/v1``).
        timeout_s: How long one call may take (a bucket of weights is large).
        on_unreachable: Awaited when the server does not answer, before the error is raised:
            the owner of a server process raises a better error there (its exit code and log).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 600.0,
        on_unreachable: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self._url, timeout=timeout_s)
        self._on_unreachable = on_unreachable

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._url

    async def world_size(self) -> int:
        """The server's workers (tensor x pipeline x data parallel)."""
        return int((await self.call("GET", "/get_world_size"))["world_size"])

    async def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's transfer."""
        await self.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    async def start_weight_update(self) -> None:
        """Begin receiving one sync."""
        await self.call("POST", "/start_weight_update")

    async def update_weights(self, update_info: Any) -> None:
        """Receive one bucket; CUDA IPC handles are not JSON, so they travel pickled as vLLM's
        own HTTP client sends them."""
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        await self.call(
            "POST", "/update_weights", {"update_info": _json_safe_update_payload(update_info)}
        )

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finish the sync."""
        await self.call(
            "POST",
            "/finish_weight_update",
            {"weight_version": weight_version} if weight_version else None,
        )

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop cached KV (computed with the old weights); ``running``: also the KV of requests
        in flight, which vLLM recomputes with the new weights before they go on."""
        await self.call(
            "POST", "/reset_prefix_cache" + ("?reset_running_requests=true" if running else "")
        )

    async def pause_generation(self) -> None:
        """Freeze the requests in flight (``keep``) until :meth:`resume_generation`."""
        await self.call("POST", "/pause?mode=keep")

    async def resume_generation(self) -> None:
        """Let paused requests go on (with whatever weights the engine now has)."""
        await self.call("POST", "/resume")

    async def sleep(self) -> None:
        """Offload the weights and free the KV cache (sleep level 1)."""
        await self.call("POST", "/sleep?level=1")

    async def wake_up(self, tags: str | None = None) -> None:
        """Reload what :meth:`sleep` freed: ``weights``, ``kv_cache``, or both (None)."""
        await self.call("POST", "/wake_up" + (f"?tags={tags}" if tags else ""))

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter saved at ``path`` (a folder on the server's host) as ``name``
        (the server needs ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
        Never in place: vLLM re-reads an in-place adapter from disk at every forward step."""
        body = {"lora_name": name, "lora_path": path}
        try:
            await self.call("POST", "/v1/load_lora_adapter", body)
        except EngineError as e:
            raise EngineError(
                f"{e} (an adapter sync needs a vLLM started with --enable-lora "
                "--max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, on the trainer's "
                "host; or set rollout.vllm.lora_sync=merged)"
            ) from e

    async def unload_lora_adapter(self, name: str) -> None:
        """Forget the adapter ``name`` (requests in flight keep theirs)."""
        await self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    async def serves_weight_routes(self) -> bool:
        """Whether the server runs in dev mode (vLLM serves the weight routes only then)."""
        return (await self._http.get("/weight_info")).status_code != 404

    async def healthy(self, timeout_s: float = 10.0) -> int:
        """``/health``'s status code (raises ``httpx.TransportError`` when there is no answer)."""
        return (await self._http.get("/health", timeout=timeout_s)).status_code

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One request; its JSON answer (``{}`` when empty).

        Raises:
            EngineUnavailableError: The server did not answer.
            EngineError: It answered with an error status (its body is quoted).
        """
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.TransportError as e:
            if self._on_unreachable is not None:
                await self._on_unreachable()
            raise EngineUnavailableError(
                f"vLLM at {self._url} did not answer {path}: {type(e).__name__}: {e}"
            ) from e
        if response.status_code != 200:
            raise EngineError(
                f"vLLM at {self._url}: {path} -> HTTP {response.status_code}: {response.text[:500]}"
            )
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:  # a plain-text answer (vLLM's LoRA routes)
            return {"text": response.text}

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._http.aclose()
