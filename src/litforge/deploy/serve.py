"""`python serve.py ckpt_path=...` (or `model_path=model.onnx|model.pt2`): an HTTP server that
classifies images, built on LitServe (Lightning's serving library: model processes, dynamic
batching).

- `POST /predict`, the image file's bytes as the body (or a multipart form's `file` field):
  `{"label": ..., "probability": ..., "top_k": [{"label": ..., "probability": ...}, ...]}`.
- `GET /health`: `not ready` (503) while the model processes load the model and run it once,
  then `ok` (200).
- A body that is no image, empty, of more than `server.max_image_pixels` pixels (read from its
  header: never decoded), or over `server.max_body_bytes`: 400 or 413 with the reason.
- At most `server.max_decode_pixels` pixels are decoded at once in an HTTP process
  (`DecodeBudget`): an upload that would go over waits its turn, within `server.timeout`.
- No answer within `server.timeout` seconds of the request's arrival: 504 (`AnswerWithin`).
- SIGTERM or Ctrl+C: every process of the server stops, requests in flight given `GRACE`.

Uploads are read and decoded in the HTTP process (`image_from_request`), before they reach the
model: LitServe answers a whole batch with the error of one bad request, so a bad upload must
never get into a batch. The model process stacks whatever requests arrived within
`server.batch_timeout` (up to `server.max_batch_size`) and runs them as one batch.
"""

# No `from __future__ import annotations`: FastAPI reads `decode_request`'s annotation as an object.

import asyncio
import collections
import contextlib
import contextvars
import io
import logging
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import litserve as ls
import numpy as np
import torch
from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from omegaconf import DictConfig
from starlette.concurrency import run_in_threadpool

from litforge.console import CONFIG_TREE, print_config
from litforge.data.images import BadImageError, image_size
from litforge.deploy.inference import (
    InputContract,
    load_classifier,
    model_source,
    restore_callbacks,
    top_k,
)
from litforge.errors import UserError
from litforge.settings import NonNegative, Positive, PositiveInt, check_values

log = logging.getLogger(__name__)

# serve.yaml's settings: their types and bounds (as `checks.OTHERS` has train.yaml's).
SETTINGS = {
    "top_k": PositiveInt,
    "server.host": Literal["127.0.0.1", "0.0.0.0", "::"],  # what LitServe binds to
    "server.max_batch_size": PositiveInt,
    "server.batch_timeout": NonNegative,
    "server.max_body_bytes": PositiveInt,
    "server.max_image_pixels": PositiveInt,
    "server.max_decode_pixels": PositiveInt,
    "server.workers": PositiveInt,
    "server.accelerator": Literal["auto", "cpu", "cuda", "mps"],
    "server.timeout": Positive,
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl+C; `kill`, `docker stop`
# Seconds the HTTP processes give requests in flight to finish once the server stops (LitServe's
# 30 would keep a stopping server up that long behind one slow request).
GRACE = 2.0


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"the upload has {declared} bytes; the limit is {limit}.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"the upload has over {limit} bytes, the limit.")
    return bytes(body)


async def _form_file(request: Request, body: bytes) -> bytes:
    """The `file` field of a multipart form whose bytes (`body`) were read already."""

    async def replay() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, replay).form()
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise HTTPException(400, "a multipart upload needs the image in a field named 'file'.")
    return await upload.read()


class DecodeBudget:
    """The pixels being decoded at once in one HTTP process, at most `pixels`: uploads come in
    concurrently, and each decodes into 3 bytes a pixel (24 legal 9000x9000 PNGs of 236 KB:
    6 GB at once). A request whose image would go over the budget waits for its turn, first come
    first served; its image's size is read from the file's header, before decoding. Runs in the
    process's event loop only (no lock needed)."""

    def __init__(self, pixels: int) -> None:
        self.pixels, self.in_use = pixels, 0
        self.waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def acquire(self, pixels: int) -> int:
        """Wait until `pixels` (at most the budget) may be decoded; returns what to release."""
        pixels = min(pixels, self.pixels)
        if not self.waiting and self.in_use + pixels <= self.pixels:
            self.in_use += pixels
            return pixels
        turn = asyncio.get_running_loop().create_future()
        self.waiting.append((pixels, turn))
        try:
            await turn
        except asyncio.CancelledError:  # the request was given up (504) or its client left
            if turn.done() and not turn.cancelled():  # granted just before: handed back
                self.release(pixels)
            else:  # (`_grant` may have passed over it already: cancelled, it is not granted)
                with contextlib.suppress(ValueError):
                    self.waiting.remove((pixels, turn))
                self._grant()  # the next in line may fit now
            raise
        return pixels

    def release(self, pixels: int) -> None:
        self.in_use -= pixels
        self._grant()

    def _grant(self) -> None:
        while self.waiting and self.in_use + self.waiting[0][0] <= self.pixels:
            pixels, turn = self.waiting.popleft()
            if turn.done():  # given up on (cancelled) before its waiter has run again
                continue
            self.in_use += pixels
            turn.set_result(None)


async def prepare_within(
    budget: DecodeBudget, contract: InputContract, data: bytes, max_pixels: int
) -> np.ndarray:
    """`data` prepared as the model's input on a thread, once `budget` has room for its pixels."""
    width, height = image_size(data, max_pixels)  # over the limit: refused before it waits
    granted = await budget.acquire(width * height)
    decoding = asyncio.ensure_future(run_in_threadpool(_prepared_array, contract, data, max_pixels))

    def done(task: asyncio.Future) -> None:
        # When the thread ends, not when the request does: a request given up (504) leaves its
        # thread decoding, and those pixels are in memory until then.
        budget.release(granted)
        if not task.cancelled():
            task.exception()  # retrieved: an error nobody awaits any more is not logged

    decoding.add_done_callback(done)
    return await asyncio.shield(decoding)


async def image_from_request(request: Request) -> np.ndarray:
    """The uploaded image as the model's input (uint8 C×H×W), or an HTTPException saying what is
    wrong with the request. (A FastAPI dependency of `decode_request`: runs in the HTTP process.)
    A numpy array: it crosses to the model process as plain bytes (a tensor would travel as a
    shared-memory handle, one per request)."""
    contract: InputContract
    contract, limit, max_pixels = request.app.state.image_input
    budget: DecodeBudget = request.app.state.decode_budget
    data = await _body(request, limit)  # the limit holds for forms too, with or without a length
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        data = await _form_file(request, data)
    if not data:
        raise HTTPException(400, "the request has no body: send the image file's bytes.")
    try:  # torch work off the event loop: /health and other requests are answered meanwhile
        return await prepare_within(budget, contract, data, max_pixels)
    except BadImageError as err:
        raise HTTPException(400, f"the body is no usable image: {err}.") from None


def _prepared_array(contract: InputContract, data: bytes, max_pixels: int) -> np.ndarray:
    return contract.prepare(data, max_pixels).contiguous().numpy()


class ImageClassifierAPI(ls.LitAPI):
    """Runs in LitServe's model process(es): batches of prepared images → top-k classes."""

    def __init__(
        self,
        path: str,
        key: str,
        k: int,
        max_batch_size: int,
        batch_timeout: float,
        workers: int = 1,
    ):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.path, self.key, self.k, self.workers = path, key, k, workers

    def setup(self, device: str) -> None:
        if device == "cpu":  # the model processes share the cores rather than each take all
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.workers))
        self.model = load_classifier(self.path, device=device, key=self.key)
        # One inference before this process reports ready (/health says `not ready` until then):
        # the first sets up the kernels, which the first request would otherwise wait for.
        contract = self.model.contract
        shape = (1, contract.channels, contract.size, contract.size)
        self.model.logits(torch.zeros(shape, dtype=torch.uint8))

    def decode_request(self, request: Annotated[np.ndarray, Depends(image_from_request)]):
        return torch.from_numpy(request)  # prepared by `image_from_request` already

    def batch(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(inputs)

    def predict(self, images: torch.Tensor) -> list[list[tuple[str, float]]]:
        single = images.ndim == 3  # max_batch_size=1: LitServe passes one image
        batch = images.unsqueeze(0) if single else images
        best = top_k(self.model.logits(batch).softmax(dim=1), self.k, self.model.class_names)
        return best[0] if single else best

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, best: list[tuple[str, float]]) -> dict[str, Any]:
        return {
            "label": best[0][0],
            "probability": best[0][1],
            "top_k": [{"label": name, "probability": p} for name, p in best],
        }


class Server(ls.LitServer):
    """LitServe's server, whose HTTP processes start together with the model processes rather
    than once one of them has loaded its model: /health answers from the start, `not ready`
    (503, LitServe's check of the model processes) until every one is ready, then `ok`.
    Requests that come meanwhile wait in the queue (504 after `server.timeout`)."""

    def verify_worker_status(self) -> None:
        """LitServe's `run` (0.2.19) waits here for a model process to be ready, and only then
        starts the HTTP processes: until then /health would not answer at all. A model process
        that fails to load still stops the server: LitServe's monitor of its processes."""

    def _perform_graceful_shutdown(self, *args: Any, **kwargs: Any) -> None:
        # LitServe 0.2.19 shuts its manager down while its monitor thread still polls an event
        # of that manager (never set): a poll after that fails, and LitServe logged "Monitoring
        # worker crashed" with a BrokenPipeError traceback now and then on Ctrl+C. That one
        # failure is left unsaid from here on (private API; no upstream issue found).
        logging.getLogger("litserve.server").addFilter(closed_manager_polled)
        super()._perform_graceful_shutdown(*args, **kwargs)


def closed_manager_polled(record: logging.LogRecord) -> bool:
    """False for LitServe's monitor thread failing to reach the manager its shutdown closed."""
    error = record.exc_info[1] if record.exc_info else None
    lost = isinstance(error, (ConnectionError, EOFError))
    return not (lost and record.getMessage() == "Monitoring worker crashed")


class ModelProcessSignals(ls.Callback):
    """Runs in the model process before `setup`: Ctrl+C reaches every process of the terminal's
    process group, and the server's main process stops this one (SIGTERM) in its shutdown. A
    KeyboardInterrupt here would print a traceback, and this process would die in the middle of
    that shutdown."""

    def on_before_setup(self, *args, **kwargs) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# The uids of LitServe's response buffer that the request being answered added (see Answers).
_request_uids: contextvars.ContextVar[list[str]] = contextvars.ContextVar("request_uids")


class Answers(dict):
    """LitServe's response buffer (uid → the answer to wait for), which records the uids each
    request adds: a request given up (504) leaves its entry behind, and the model's late answer
    would fill it and stay there for good."""

    def __setitem__(self, uid: str, item: Any) -> None:
        uids = _request_uids.get(None)
        if uids is not None:
            uids.append(uid)
        super().__setitem__(uid, item)


class AnswerWithin:
    """ASGI middleware: a `path` request not answered within `seconds` of its arrival gets 504.
    LitServe's own `timeout` only answers 504 to a request that waited that long in the queue
    when the model process takes it: one whose inference runs longer would wait for good."""

    def __init__(self, app, path: str, seconds: float, answers: Answers) -> None:
        self.app, self.path, self.seconds, self.answers = app, path, seconds, answers

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            return await self.app(scope, receive, send)
        started = False

        async def send_watched(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        uids = []
        _request_uids.set(uids)  # wait_for's task runs in a copy of this context: the same list
        try:
            await asyncio.wait_for(self.app(scope, receive, send_watched), self.seconds)
        except asyncio.TimeoutError:  # the builtin TimeoutError from Python 3.11 on
            for uid in uids:  # the answer arriving later is dropped (LitServe skips unknown uids)
                self.answers.pop(uid, None)
            if not started:
                detail = f"no answer within server.timeout={self.seconds:g} seconds"
                await JSONResponse({"detail": detail}, status_code=504)(scope, receive, send)


def check_settings(cfg: DictConfig) -> None:
    check_values(cfg, SETTINGS)
    server = cfg.server
    if server.max_decode_pixels < server.max_image_pixels:
        raise UserError(
            f"server.max_decode_pixels={server.max_decode_pixels} is below server."
            f"max_image_pixels={server.max_image_pixels}: an image of the largest size allowed "
            f"could never be decoded; raise server.max_decode_pixels."
        )
    if server.accelerator == "cuda" and not torch.cuda.is_available():
        raise UserError("server.accelerator=cuda, but this machine has no CUDA GPU: use auto.")
    if server.batch_timeout >= server.timeout:
        raise UserError(
            f"server.batch_timeout={server.batch_timeout} must be below server.timeout="
            f"{server.timeout}: a request would time out waiting for its batch."
        )
    port = server.port
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise UserError(f"server.port={port} is out of range: use a port from 1024 to 65535.")


def check_port_free(host: str, port: int) -> None:
    """A UserError when something listens on `host`:`port` already (uvicorn would log the
    error and exit after the model processes started)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            raise UserError(
                f"server.port={port}: {host}:{port} is taken ({err.strerror}); stop what "
                f"serves there or choose another server.port."
            ) from None


def serve(cfg: DictConfig) -> None:
    """Load the model (in this process for its contract, and in each model process), then serve
    until interrupted."""
    server_cfg = cfg.server
    check_settings(cfg)
    path, key = model_source(cfg)
    check_port_free(server_cfg.host, server_cfg.port)
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=Path(cfg.paths.output_dir) / CONFIG_TREE)
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    for number in STOP_SIGNALS:
        signal.signal(number, _stop_handler(os.getpid()))
    try:
        _serve(cfg, path, key)
    except KeyboardInterrupt:  # before LitServe's run loop took over: stop what it started
        _stop_children()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    log.info("The server has stopped.")


def _serve(cfg: DictConfig, path: Path, key: str) -> None:
    server_cfg = cfg.server
    # LitServe forks the HTTP processes from this one. GNU OpenMP's thread pool does not survive
    # a fork: a child that runs a parallel torch op on the thread that forked waits forever for
    # pool threads that don't exist in it (fitting a 640x480 photo to 128 px is such an op).
    # With one thread torch starts no pool here, and the HTTP processes inherit the setting:
    # they prepare each image on one thread (concurrent requests run in threads), leaving the
    # cores to the model process, which is spawned (a fresh interpreter; threads set in `setup`).
    torch.set_num_threads(1)
    # An unusable file is an error before the server starts. Only the contract and a few facts
    # are kept here.
    model = load_classifier(path, key=key)
    if model.kind == "checkpoint":  # (not an exported model, which keeps no callback state)
        restore_callbacks(cfg, path)
    contract, kind, classes = model.contract, model.kind, len(model.class_names)
    del model
    _warm_up(contract)
    api = ImageClassifierAPI(
        str(path),
        key,
        cfg.top_k,
        server_cfg.max_batch_size,
        server_cfg.batch_timeout,
        server_cfg.workers,
    )
    accelerator = server_cfg.accelerator
    if kind == "onnx":
        accelerator = "cpu"  # onnxruntime's CPU provider
    answers = Answers()
    server = Server(
        api,
        accelerator=accelerator,
        workers_per_device=server_cfg.workers,
        timeout=server_cfg.timeout,  # LitServe's: for requests still queued after that long
        callbacks=[ModelProcessSignals()],
        middlewares=[
            (
                AnswerWithin,
                {"path": api.api_path, "seconds": server_cfg.timeout, "answers": answers},
            )
        ],
    )
    server.response_buffer = answers  # before the HTTP processes are forked: theirs
    server.uvicorn_graceful_timeout = GRACE
    server.app.state.image_input = (
        contract,
        server_cfg.max_body_bytes,
        server_cfg.max_image_pixels,
    )
    # Each HTTP process forked from this one has a budget of its own (one per model process).
    server.app.state.decode_budget = DecodeBudget(server_cfg.max_decode_pixels)
    url = f"http://{server_cfg.host}:{server_cfg.port}"
    log.info(
        f"Serving {path} ({kind}, {classes} classes) at {url}/predict; {url}/health says "
        f"not ready until the model is loaded, then ok. Ctrl+C stops the server."
    )
    server.run(
        host=server_cfg.host,
        port=server_cfg.port,
        generate_client_file=False,  # LitServe would write client.py into the working directory
        log_level="warning",
    )


def _warm_up(contract: InputContract) -> None:
    """Prepare a small image here: the HTTP processes forked from this one inherit what that
    imported (torchvision's decoders and transforms), which their first request would otherwise
    wait for (seconds on a small machine, against `server.timeout`)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 6)).save(buffer, "PNG")
    contract.prepare(buffer.getvalue())


def _stop_handler(server_pid: int):
    """SIGINT and SIGTERM in the server's main process: a KeyboardInterrupt, on which LitServe
    stops its processes (without it, `kill` and `docker stop` would leave them running)."""

    def stop(number: int, frame) -> None:
        if os.getpid() != server_pid:
            # A process forked from this one (LitServe's HTTP processes): uvicorn puts this
            # handler back after its own graceful shutdown and raises the signal again. End as
            # the signal's default action does, with no KeyboardInterrupt traceback.
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        # Once: a second signal would interrupt LitServe's shutdown (bounded: GRACE, then 5 s per
        # model process) and leave processes behind.
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise KeyboardInterrupt

    return stop


def _stop_children(seconds: float = 5.0) -> None:
    """Stop the processes LitServe started (a signal came before its run loop watched for one):
    SIGTERM, then SIGKILL for any still there after `seconds`."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    deadline = time.monotonic() + seconds
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
