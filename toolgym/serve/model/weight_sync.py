"""``toolgym serve model`` as a stand-in for TRL's vLLM server: vLLM's weight-transfer endpoints, over HTTP.

TRL 1.16's ``VLLMClient`` (server mode of ``GRPOTrainer``) talks to ``vllm serve`` started with
``VLLM_SERVER_DEV_MODE=1 --weight-transfer-config '{"backend": "nccl"}'``: generation through ``/v1/completions``
(token-id prompts, ``return_token_ids``, ``return_tokens_as_token_ids``, sampled-token logprobs: what
:class:`~toolgym.serve.model.server.ModelServer` already answers), and these dev endpoints, which this module adds:

* ``GET /server_info`` (``{"vllm_config": {"weight_transfer_config": {"backend": "http"}, ...}}``),
  ``GET /get_world_size`` (``{"world_size": 1}``);
* ``POST /init_weight_transfer_engine`` (``{"init_info": ...}``: vLLM joins an NCCL group here);
* ``POST /start_weight_update``, ``POST /update_weights`` (``{"update_info": {"names", "dtype_names", "shapes"}}``:
  announces the tensors), ``POST /finish_weight_update``; ``POST /reset_prefix_cache``.

vLLM receives the announced tensors by an NCCL broadcast from the trainer, which needs CUDA. Here they come over
HTTP instead: ``POST /update_weights/tensors`` with a safetensors body holding exactly the announced tensors
(names, dtypes and shapes checked; a mismatch is a 400 and nothing is written). ``GET /weight_sync/stats`` counts
what happened (communicator inits, updates, tensors, prefix-cache resets, the last completion requests' sampling
fields), so a test can tell a run that synced from one that did not. The trainer-side half (replacing the NCCL
broadcast in TRL's client) lives with the tests that emulate the GPU path on CPU (``tests/trl_server_worker.py``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from toolgym.serve.model.protocol import BadRequest
from toolgym.serve.model.server import ModelServer

__all__ = ["TrainableModelServer"]

_RECORDED = ("n", "max_tokens", "temperature", "logprobs", "stop_token_ids", "return_token_ids")


class TrainableModelServer(ModelServer):
    """A :class:`ModelServer` whose weights a trainer can replace through vLLM's weight-transfer endpoints
    (see the module docstring). Same arguments as :class:`ModelServer`.

    Attributes:
        stats: ``inits``, ``updates`` (finished weight updates), ``tensors`` (tensors written), ``resets``,
            ``completions`` (completion requests) and ``last_request`` (their sampling fields).
    """

    def __init__(self, model: Any, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.stats: dict[str, Any] = {"inits": 0, "updates": 0, "tensors": 0, "resets": 0, "completions": 0,
                                      "last_request": {}}
        self._announced: dict[str, tuple[str, tuple[int, ...]]] | None = None

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_world_size", self.world_size)
        app.router.add_post("/init_weight_transfer_engine", self.init_engine)
        app.router.add_post("/start_weight_update", self.start_update)
        app.router.add_post("/update_weights", self.announce)
        app.router.add_post("/update_weights/tensors", self.receive)
        app.router.add_post("/finish_weight_update", self.finish_update)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/weight_sync/stats", self.get_stats)
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)  # aiohttp caches the body: the handler reads it again
        self.stats["completions"] += 1
        self.stats["last_request"] = {k: body.get(k) for k in _RECORDED}
        return await super().completions(request)

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"vllm_config": {
            "weight_transfer_config": {"backend": "http"},
            "model_config": {"model": self.served_model_name, "max_model_len": self.max_model_len,
                             "logprobs_mode": self.logprobs_mode},
        }})

    async def world_size(self, request: web.Request) -> web.Response:
        return web.json_response({"world_size": 1})

    async def init_engine(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if not isinstance(body.get("init_info"), dict):
            raise BadRequest("`init_info` must be an object", "init_info")
        self.stats["inits"] += 1
        return web.json_response({})

    async def start_update(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def announce(self, request: web.Request) -> web.Response:
        info = (await self._json(request)).get("update_info")
        if not isinstance(info, dict):
            raise BadRequest("`update_info` must be an object", "update_info")
        names, dtypes, shapes = info.get("names"), info.get("dtype_names"), info.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            raise BadRequest("`update_info` needs `names`, `dtype_names` and `shapes` of one length", "update_info")
        params = dict(self.engine.model.named_parameters())
        unknown = [n for n in names if n not in params]
        if unknown:
            raise BadRequest(f"unknown parameters {unknown[:5]}", "update_info")
        self._announced = {n: (str(d), tuple(int(x) for x in s)) for n, d, s in zip(names, dtypes, shapes, strict=True)}
        return web.json_response({})

    async def receive(self, request: web.Request) -> web.Response:
        import asyncio

        from safetensors.torch import load

        if self._announced is None:
            raise BadRequest("no tensors were announced (POST /update_weights first)")
        try:
            tensors = load(await request.read())
        except Exception as e:
            raise BadRequest(f"the body is not a safetensors blob: {e}") from None
        announced, self._announced = self._announced, None
        got = {n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in tensors.items()}
        if got != announced:
            diff = sorted(set(got.items()) ^ set(announced.items()))[:5]
            raise BadRequest(f"the tensors differ from the announcement: {diff}")
        await asyncio.to_thread(self._write, tensors)
        return web.json_response({"tensors": len(tensors)})

    def _write(self, tensors: dict[str, Any]) -> None:
        import torch

        params = dict(self.engine.model.named_parameters())
        with self.engine.lock, torch.no_grad():  # never in the middle of a forward pass
            for name, t in tensors.items():
                params[name].copy_(t.to(params[name].dtype))
        self.stats["tensors"] += len(tensors)

    async def finish_update(self, request: web.Request) -> web.Response:
        self.stats["updates"] += 1
        return web.json_response({})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.stats["resets"] += 1
        return web.json_response({"success": True})

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats)
