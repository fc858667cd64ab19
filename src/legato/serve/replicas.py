"""Several engines behind Ray Serve, routed by adapter (model multiplexing) and by load.

A ``Router`` deployment is the HTTP ingress (FastAPI on Ray Serve's proxy): it checks the
OpenAI body, then calls an ``EngineReplica`` through a deployment handle whose
``multiplexed_model_id`` is the adapter the body names. Ray Serve sends the call to a replica
that already holds that adapter when one does, and otherwise to the less loaded of two
(its power-of-two-choices router); a replica loads an adapter it lacks from the PEFT folder
the router sends with the call and, past ``adapters_per_replica``, unloads the least
recently used one (``@serve.multiplexed``'s LRU) once its requests have finished. Folders
must be readable where the replicas run (one host, or storage every node mounts). Each replica is the engine
``legato serve`` runs alone, with its own device pool and policy, answering through the same
``Frontend``; a whole answer names the replica that computed it in ``system_fingerprint``.
The router's app is the single server's ``openai_app``: the same guard (``access.py``: API
key, body bound, runtime adapter loads only under the lora roots) and the same errors.
No cluster manager of our own: placement, health checks and restarts are Ray Serve's.

No ``from __future__ import annotations`` here: Ray Serve ships the deployment classes by
value, and FastAPI could not resolve string annotations of the routes on the replicas.
"""

import asyncio
import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import ray
import torch
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle

from legato.errors import CheckpointError, ConfigError
from legato.local_ray import local_ray
from legato.lora.peft_io import CONFIG_FILE, load_adapter
from legato.serve.access import Access
from legato.serve.engine import Engine, EngineConfig
from legato.serve.frontend import Frontend
from legato.serve.loading import adapter_folders, load_served_model
from legato.serve.protocol import ChatRequest, CompletionRequest, LoadLora, UnloadLora, model_list
from legato.serve.sampling import RequestError

UNLOAD_WAIT_S = 120.0  # an evicted adapter's requests finish first (max_tokens bounds them)


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica builds: the model (as ``legato serve --model``) and its engine."""

    model: str = "tiny"
    weights: str | None = None
    tokenizer: str | None = None
    config: EngineConfig = field(default_factory=EngineConfig)


class _Loaded:
    """An adapter resident on one replica; Ray Serve's LRU calls ``__del__`` to evict it."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine, self.name = engine, name

    def __del__(self) -> None:  # run by Ray Serve in a worker thread, so it may wait
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while time.monotonic() < deadline:
            try:
                self.engine.unload_adapter(self.name)
                return
            except RequestError as exc:
                if exc.status == 404:  # already gone
                    return
                time.sleep(0.01)  # requests in flight: let them finish


def replica_deployment(adapters_per_replica: int):
    """The ``EngineReplica`` deployment class, holding at most ``adapters_per_replica``
    adapters (the multiplexing bound is fixed when the class is made, hence a factory)."""

    @serve.deployment
    class EngineReplica:
        def __init__(self, spec: ReplicaSpec) -> None:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
            torch.set_num_threads(max(1, int(cpus)))  # replicas on one host share its cores
            model, tokenizer, name = load_served_model(spec.model, spec.weights, spec.tokenizer)
            self.engine = Engine(model, tokenizer, {}, spec.config, model_name=name)
            self.frontend = Frontend(self.engine)
            self.tag = serve.get_replica_context().replica_tag
            self._folders: dict[str, str] = {}  # multiplexed id -> PEFT folder

        @serve.multiplexed(max_num_models_per_replica=adapters_per_replica)
        async def adapter(self, key: str) -> _Loaded:
            adapter = await asyncio.to_thread(load_adapter, self._folders[key], self.engine.model)
            self.engine.load_adapter(key, adapter.eval())
            return _Loaded(self.engine, key)

        async def _submit(self, body, chat: bool, folder: str | None):
            key = serve.get_multiplexed_model_id()
            if not key:
                return self.frontend.submit(body, chat)
            self._folders[key] = folder
            for attempt in range(2):
                await self.adapter(key)
                try:
                    return self.frontend.submit(body, chat, adapter=key)
                except RequestError as exc:
                    # evicted (in Ray Serve's unload thread) between the two lines: reload once
                    if exc.status != 404 or attempt:
                        raise

        async def answer(self, body, chat: bool, folder: str | None) -> dict:
            result = await (await self._submit(body, chat, folder)).result()
            return {**result, "system_fingerprint": self.tag}

        async def stream(self, body, chat: bool, folder: str | None):
            pending = await self._submit(body, chat, folder)
            async for event in pending.events():
                yield event

    return EngineReplica


@serve.deployment(ray_actor_options={"num_cpus": 0})  # it only waits on replicas
@serve.ingress()
class Router:
    """The OpenAI API in front of the replicas, behind the same guard as the single server
    (``access``); the one place that knows each adapter's folder. A load gives the name a new
    multiplexed id (``name#version``), so a replica never answers with a copy it loaded
    before an unload and reload of that name."""

    def __init__(
        self, replicas: DeploymentHandle, base: str, folders: dict[str, str], access: Access
    ) -> None:
        self.replicas, self.base, self.access = replicas, base, access
        self.folders = {name: (folder, 0) for name, folder in folders.items()}
        self._versions = itertools.count(1)

    def __serve_build_asgi_app__(self) -> FastAPI:
        from legato.serve.server import openai_app

        app = openai_app("legato (Ray Serve)", self.access)

        def target(model: str, stream: bool) -> tuple[DeploymentHandle, str | None]:
            if model == self.base:
                return self.replicas.options(stream=stream), None
            if model not in self.folders:
                raise RequestError(f"model: the model {model!r} does not exist", 404, "model")
            folder, version = self.folders[model]
            key = f"{model}#{version}"
            return self.replicas.options(multiplexed_model_id=key, stream=stream), folder

        async def answer(body, chat: bool):
            handle, folder = target(body.model, body.stream)
            try:
                if not body.stream:
                    return await handle.answer.remote(body, chat, folder)
                events = handle.stream.remote(body, chat, folder)
                first = await events.__anext__()  # a refusal surfaces here, before the 200
            except RayTaskError as exc:
                raise _cause(exc) from None
            return StreamingResponse(_chain(first, events), media_type="text/event-stream")

        @app.post("/v1/completions")
        async def completions(body: CompletionRequest):
            return await answer(body, False)

        @app.post("/v1/chat/completions")
        async def chat_completions(body: ChatRequest):
            return await answer(body, True)

        @app.get("/v1/models")
        async def models():
            return model_list(self.base, {n: f for n, (f, _) in self.folders.items()})

        @app.post("/v1/load_lora_adapter")
        async def load_lora(body: LoadLora):
            folder = self.access.adapter_folder(body.lora_path)
            if body.lora_name == self.base:
                raise RequestError("lora_name: that is the base model's name", 400, "lora_name")
            if body.lora_name in self.folders:  # as vLLM: unload first
                raise RequestError(f"lora_name: {body.lora_name!r} is already loaded", 400,
                                   "lora_name")  # fmt: skip
            if not (folder / CONFIG_FILE).is_file():
                raise RequestError(f"lora_path: {body.lora_path} is not a PEFT adapter folder "
                                   f"({CONFIG_FILE})", 400, "lora_path")  # fmt: skip
            self.folders[body.lora_name] = (str(folder), next(self._versions))
            return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora(body: UnloadLora):
            self.access.check_updating()
            if self.folders.pop(body.lora_name, None) is None:
                raise RequestError(
                    f"lora_name: no adapter named {body.lora_name!r}", 404, "lora_name"
                )
            return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

        @app.get("/health")
        async def health():
            return Response(status_code=200)

        return app


async def _chain(first: str, events):
    yield first
    async for event in events:
        yield event


def _cause(exc: RayTaskError) -> Exception:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, RequestError) else RequestError(str(exc), 500)


def build_app(
    spec: ReplicaSpec,
    adapters: list[str],
    replicas: int,
    adapters_per_replica: int,
    access: Access | None = None,
):
    """The Ray Serve application: ``replicas`` engines (one CPU each) behind a router,
    serving the PEFT folders of ``adapters`` (as ``legato serve --adapters``), guarded by
    ``access`` (default: no key, no runtime adapter loading)."""
    if replicas < 1 or adapters_per_replica < 1:
        raise ConfigError(
            f"--replicas and --adapters-per-replica: must be >= 1, got {replicas} and "
            f"{adapters_per_replica}"
        )
    try:
        folders = {n: str(p) for n, p in adapter_folders(adapters).items()}
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    # built once here too: a bad --model fails in this process, not on every replica
    base = load_served_model(spec.model, spec.weights, spec.tokenizer)[2]
    engine = replica_deployment(adapters_per_replica).options(
        num_replicas=replicas, ray_actor_options={"num_cpus": 1}
    )
    return Router.bind(engine.bind(spec), base, folders, access or Access())


@contextmanager
def ray_serve(app, host: str, port: int, cpus: int | None = None) -> Iterator[str]:
    """Run ``app`` (``build_app``) on a Ray instance started on this host's loopback for the
    ``with`` block (``cpus``: logical CPUs, default the host's; ``local_ray``), HTTP on
    ``host:port``; yields the base URL. Ray Serve and Ray are shut down when it ends."""
    with local_ray(cpus or os.cpu_count() or 1):
        try:
            serve.start(http_options={"host": host, "port": port})
            serve.run(app, name="legato", route_prefix="/")
            yield f"http://{host}:{port}"
        finally:
            serve.shutdown()
