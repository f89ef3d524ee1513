"""`python serve.py ckpt_path=...`: real HTTP requests from concurrent clients on 127.0.0.1, bad
uploads answered 4xx while the server keeps serving, and the batched path of the model process;
camera-sized photos on models of 128 and 224 px, `server.timeout` on a slow model, and how the
server stops (SIGTERM, Ctrl+C)."""

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi import Request
from helpers import (
    ROOT,
    TEST_PACKAGES,
    compose_config,
    free_port,
    photo,
    png_bomb,
    process_group,
    write_checkpoint,
    write_cnn_checkpoint,
)

from litforge.deploy.inference import InputContract, load_classifier, top_k
from litforge.deploy.serve import (
    Answers,
    AnswerWithin,
    ImageClassifierAPI,
    closed_manager_polled,
    serve,
)
from litforge.errors import UserError

LIMIT = 200_000  # server.max_body_bytes of the test server
ANSWER_SECONDS = 30  # a photo's answer comes in well under 1 s: longer is a hung server
# serve.py whose checkpoints may build helpers' test networks (helpers.SlowNet)
WITH_TEST_NETWORKS = "tests/deploy/serve_with_test_networks.py"


def post(
    url: str, body: bytes, content_type: str = "application/octet-stream", timeout: float = 60
):
    """(status, decoded JSON answer) of a POST."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def multipart(field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body with one file field, as `curl -F field=@file` sends it."""
    boundary = "litforge-test-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"'
            f"\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


@contextlib.contextmanager
def started_server(log_dir, *overrides: str, script: str = "serve.py"):
    """serve.py (or `script`, which runs it) with `overrides`, in its own process group (its id:
    the server's pid), output into `log_dir`/output.txt; yields its URL, process and output file
    at once, and stops all its processes at the end."""
    port = free_port()
    output = log_dir / "output.txt"
    process = subprocess.Popen(
        [
            sys.executable,
            script,
            f"server.port={port}",
            "server.accelerator=cpu",
            f"hydra.run.dir={log_dir}",
            *overrides,
        ],
        cwd=ROOT,
        stdout=output.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", process, output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # whatever of the server is left
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def health_answer(url: str, process, output, skip: tuple[int, ...] = ()) -> tuple[int, bytes]:
    """The first answer of `url`/health whose status is not in `skip`, asking until one comes;
    fails if the server exits first or 120 s pass (for the model process to load)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            answer = get(f"{url}/health", timeout=5)
            if answer[0] not in skip:
                return answer
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            pytest.fail(f"serve.py did not become healthy: {output.read_text()[-3000:]}")
        try:  # the pause between polls, ending early if the server died
            process.wait(timeout=0.2)
            pytest.fail(f"serve.py exited {process.returncode}: {output.read_text()[-3000:]}")
        except subprocess.TimeoutExpired:
            pass


@contextlib.contextmanager
def running_server(log_dir, *overrides: str, script: str = "serve.py"):
    """`started_server`, yielded once /health says ok."""
    with started_server(log_dir, *overrides, script=script) as (url, process, output):
        assert health_answer(url, process, output, skip=(503,)) == (200, b"ok")
        yield url, process, output


def get_ok(url: str) -> bool:
    try:
        return get(url, timeout=5) == (200, b"ok")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.fixture
def test_networks(monkeypatch):
    """Checkpoints of helpers' test networks load in this process (as in WITH_TEST_NETWORKS)."""
    import litforge.checkpoints

    trusted = (*litforge.checkpoints.TRUSTED_PACKAGES, *TEST_PACKAGES)
    monkeypatch.setattr(litforge.checkpoints, "TRUSTED_PACKAGES", trusted)


@pytest.fixture(scope="module")
def server(tmp_path_factory, trained_images):
    """serve.py on the trained checkpoint; its URL and process once healthy."""
    overrides = [
        f"ckpt_path={trained_images.checkpoint}",
        f"server.max_body_bytes={LIMIT}",
        "server.batch_timeout=0.05",  # wide enough for the concurrent requests to batch
    ]
    with running_server(tmp_path_factory.mktemp("serve"), *overrides) as (url, process, _):
        yield url, process


@pytest.mark.slow
def test_concurrent_requests_get_the_models_answers(server, trained_images):
    url, _ = server
    names = trained_images.class_names

    def ask(i: int):
        data = trained_images.test_files[i].read_bytes()
        if i % 2:  # half as multipart form uploads (curl -F file=@...), half as the raw body
            return post(f"{url}/predict", *multipart("file", "image", data))
        return post(f"{url}/predict", data)

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(ask, range(len(trained_images.test_files))))
    for (status, answer), expected in zip(answers, trained_images.probabilities, strict=True):
        assert status == 200, answer
        assert answer["label"] == names[int(expected.argmax())]
        assert answer["probability"] == pytest.approx(expected.max().item(), abs=1e-5)
        assert [entry["label"] for entry in answer["top_k"]] == [
            names[i] for i in expected.argsort(descending=True).tolist()
        ]


@pytest.mark.slow
def test_bad_uploads_are_4xx_with_the_reason_and_the_server_keeps_serving(server, trained_images):
    url, process = server
    predict = f"{url}/predict"
    status, answer = post(predict, b"GIF89a, but no image follows")
    assert status == 400 and "not an image" in answer["detail"]
    status, answer = post(predict, b"")
    assert status == 400 and "no body" in answer["detail"]
    status, answer = post(predict, png_bomb(10_000, 10_000))  # ~100 KB, 100 MB of pixels
    assert status == 400 and "10000x10000 pixels, more than the 89,478,485" in answer["detail"]
    status, answer = post(predict, os.urandom(LIMIT + 1))
    assert status == 413 and f"limit is {LIMIT}" in answer["detail"]
    status, answer = post(
        predict, *multipart("image", "x.png", trained_images.test_files[0].read_bytes())
    )
    assert status == 400 and "field named 'file'" in answer["detail"]

    status, answer = post(predict, trained_images.test_files[0].read_bytes())
    assert status == 200 and answer["label"] in trained_images.class_names
    assert process.poll() is None


def test_model_process_batches_an_exported_model(exported_onnx, trained_images):
    """What LitServe's model process runs, on model.onnx: a batch of prepared images gives each
    its own answer, the same as alone."""
    api = ImageClassifierAPI(str(exported_onnx), "model_path", 2, max_batch_size=8, batch_timeout=0)
    api.setup("cpu")
    contract: InputContract = api.model.contract
    # as image_from_request hands them over
    prepared = [contract.prepare(path.read_bytes()).numpy() for path in trained_images.test_files]
    images = [api.decode_request(image) for image in prepared]
    answers = [api.encode_response(best) for best in api.unbatch(api.predict(api.batch(images)))]
    names = trained_images.class_names
    for answer, expected in zip(answers, trained_images.probabilities, strict=True):
        assert answer["label"] == names[int(expected.argmax())]
        assert answer["probability"] == pytest.approx(expected.max().item(), abs=1e-5)
        assert len(answer["top_k"]) == 2
    alone = api.encode_response(api.predict(images[3]))  # as with max_batch_size=1
    assert alone["label"] == answers[3]["label"]
    assert alone["probability"] == pytest.approx(answers[3]["probability"], abs=1e-6)


def test_taken_port_and_bad_host_are_one_line_errors(tmp_path, trained_images):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = compose_config(
            "serve", tmp_path, [f"ckpt_path={trained_images.checkpoint}", f"server.port={port}"]
        )
        with pytest.raises(UserError, match=f"server.port={port}: 127.0.0.1:{port} is taken"):
            serve(cfg)
    cfg = compose_config("serve", tmp_path, ["ckpt_path=a.ckpt", "server.host=localhost"])
    with pytest.raises(
        UserError, match="server.host=localhost: must be one of: 127.0.0.1, 0.0.0.0"
    ):
        serve(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("size", [128, 224])
def test_photos_are_answered_alone_and_concurrently(tmp_path, size):
    """640x480 JPEG and PNG photos on an RGB model of `size` px (fitting them to it is work
    torch splits over threads), one request, then eight at once: each gets the model's answer,
    and the server stays healthy."""
    checkpoint = write_cnn_checkpoint(tmp_path / f"cnn_{size}.ckpt", size)
    photos = [photo(seed, file_format=("JPEG", "PNG")[seed % 2]) for seed in range(8)]
    model = load_classifier(checkpoint)
    expected = [
        top_k(
            model.logits(model.contract.prepare(data)[None]).softmax(dim=1), 3, model.class_names
        )[0]
        for data in photos
    ]
    with running_server(tmp_path, f"ckpt_path={checkpoint}") as (url, _, _):
        answers = [post(f"{url}/predict", photos[0], timeout=ANSWER_SECONDS)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers += pool.map(
                lambda data: post(f"{url}/predict", data, timeout=ANSWER_SECONDS), photos
            )
        assert get_ok(f"{url}/health")
    for (status, answer), best in zip(answers, expected[:1] + expected, strict=True):
        assert status == 200, answer
        assert [entry["label"] for entry in answer["top_k"]] == [name for name, _ in best]
        assert answer["probability"] == pytest.approx(best[0][1], abs=1e-4)


@pytest.mark.slow
def test_an_inference_slower_than_the_timeout_is_504_and_the_server_keeps_serving(
    tmp_path, test_networks
):
    # Every inference sleeps 2 s: slower than the timeout on any machine.
    net = {"_target_": "helpers.SlowNet", "seconds": 2.0}
    checkpoint = write_checkpoint(tmp_path / "slow_224.ckpt", 224, net)
    timeout = 0.5
    overrides = [f"ckpt_path={checkpoint}", f"server.timeout={timeout}"]
    with running_server(tmp_path, *overrides, script=WITH_TEST_NETWORKS) as (url, process, _):
        status, answer = post(f"{url}/predict", photo(1), timeout=ANSWER_SECONDS)
        assert status == 504, answer
        assert f"server.timeout={timeout:g}" in answer["detail"]
        # The model process is still busy with it; the HTTP process answers meanwhile.
        assert get_ok(f"{url}/health")
        status, answer = post(f"{url}/predict", photo(2), timeout=ANSWER_SECONDS)
        assert status == 504, answer
        assert get_ok(f"{url}/health")
        assert process.poll() is None


@pytest.mark.slow
def test_health_says_not_ready_until_the_model_is_loaded_and_has_run_once(tmp_path, test_networks):
    """/health answers while the model process loads the model: 503 `not ready`; its setup
    runs the model once (here a network whose first forward waits at a gate this test opens)
    before /health says ok, so that the first request does not wait for that warm-up."""
    with socket.create_server(("127.0.0.1", 0)) as gate:
        gate.settimeout(120)  # for the model process to load and connect
        net = {"_target_": "helpers.SlowNet", "gate": gate.getsockname()[1]}
        checkpoint = write_checkpoint(tmp_path / "gated_224.ckpt", 224, net)
        overrides = [f"ckpt_path={checkpoint}"]
        with started_server(tmp_path, *overrides, script=WITH_TEST_NETWORKS) as (
            url,
            process,
            output,
        ):
            assert health_answer(url, process, output) == (503, b"not ready")
            waiting, _ = gate.accept()  # the model process, in its setup's first inference
            with waiting:
                assert get(f"{url}/health") == (503, b"not ready")
                waiting.sendall(b"go")
            assert health_answer(url, process, output, skip=(503,)) == (200, b"ok")
            status, answer = post(f"{url}/predict", photo(0), timeout=ANSWER_SECONDS)
            assert status == 200, answer


def test_the_model_process_runs_the_model_once_in_its_setup(tmp_path, test_networks):
    """The warm-up: LitServe reports a model process ready once its `setup` has returned."""
    checkpoint = write_checkpoint(tmp_path / "slow_128.ckpt", 128, {"_target_": "helpers.SlowNet"})
    api = ImageClassifierAPI(str(checkpoint), "ckpt_path", 3, max_batch_size=4, batch_timeout=0)
    api.setup("cpu")
    assert api.model.run.net.calls == 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl+C"])
def test_sigterm_and_ctrl_c_stop_every_process_of_the_server_within_5_s(tmp_path, how):
    checkpoint = write_cnn_checkpoint(tmp_path / "cnn_128.ckpt", 128)
    with running_server(tmp_path, f"ckpt_path={checkpoint}") as (url, process, output):
        status, answer = post(f"{url}/predict", photo(0), timeout=ANSWER_SECONDS)
        assert status == 200, answer
        started = process_group(process.pid)
        assert len(started) >= 3, started  # this one, the HTTP and the model process (at least)
        stop = time.monotonic() + 5
        if how == "SIGTERM":  # `kill`, `docker stop`: the main process
            os.kill(process.pid, signal.SIGTERM)
        else:  # the terminal sends Ctrl+C's SIGINT to the whole foreground process group
            os.killpg(process.pid, signal.SIGINT)
        while process_group(process.pid) and time.monotonic() < stop:
            with contextlib.suppress(subprocess.TimeoutExpired):  # the pause between polls
                process.wait(timeout=0.05)
        left = process_group(process.pid)
        assert not left, f"still running 5 s after {how}: {left} of {started}"
        assert process.wait(timeout=1) == 0
    text = output.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "The server has stopped." in text


def test_only_litserves_poll_of_its_closed_manager_is_left_unsaid_on_stopping():
    """LitServe's monitor thread may poll the manager its shutdown has just closed: that
    BrokenPipeError is not shown; any other error of its monitor, or a poll's other failure, is."""

    def record(message: str, error: BaseException | None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error else None
        return logging.LogRecord("litserve.server", logging.ERROR, "", 0, message, (), exc_info)

    assert not closed_manager_polled(record("Monitoring worker crashed", BrokenPipeError(32)))
    assert not closed_manager_polled(record("Monitoring worker crashed", EOFError()))
    assert closed_manager_polled(record("Monitoring worker crashed", KeyError("uid")))
    assert closed_manager_polled(record("⚠️ Worker w died; shutting down", BrokenPipeError(32)))


def test_a_request_given_up_on_leaves_no_answer_behind():
    """AnswerWithin on a handler that waits as LitServe's does (its uid in the response buffer):
    504 at the timeout, and the uid out of the buffer, so that the late answer is dropped."""
    answers = Answers()
    answers["someone-else"] = "waiting"

    async def handler(scope, receive, send):
        answers["mine"] = "waiting"
        await asyncio.Event().wait()  # the model's answer never comes

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = AnswerWithin(handler, "/predict", seconds=0.05, answers=answers)
    scope = {"type": "http", "path": "/predict", "method": "POST", "headers": []}
    asyncio.run(middleware(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 504
    assert json.loads(sent[1]["body"]) == {"detail": "no answer within server.timeout=0.05 seconds"}
    assert list(answers) == ["someone-else"]


def upload(data: bytes, state) -> Request:
    """A POST /predict of `data` as the HTTP process receives it, for an app whose state is
    `state`."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/predict",
        "headers": [(b"content-length", str(len(data)).encode())],
        "app": SimpleNamespace(state=state),
    }

    async def receive():
        return {"type": "http.request", "body": data, "more_body": False}

    return Request(scope, receive)


async def settle() -> None:
    """Let every task run until it waits for something only the test sets (no I/O, no clock)."""
    for _ in range(100):
        await asyncio.sleep(0)


def test_concurrent_uploads_decode_within_the_pixel_budget(monkeypatch):
    """24 concurrent uploads of 9000x9000 PNGs (81 KB each, under server.max_image_pixels; 81 M
    pixels, 243 MB once decoded): at most `server.max_decode_pixels` of them are decoded at once,
    the others wait their turn in order, and each gets its image. (24 at once took a server from
    1.9 to 7.6 GB.) The decoding thread is stood in for by one the test lets finish."""
    from litforge.deploy import serve as serve_module

    data = png_bomb(9000, 9000)
    contract = InputContract(3, 224, (0.5,) * 3, (0.25,) * 3)
    budget = serve_module.DecodeBudget(2 * 9000 * 9000 + 1000)  # room for two
    state = SimpleNamespace(image_input=(contract, LIMIT, 89_478_485), decode_budget=budget)
    decoding: list[tuple[int, asyncio.Event]] = []  # (upload, its thread's end) being decoded now
    order = []

    async def decoding_thread(function, contract, data, max_pixels):
        assert function is serve_module._prepared_array
        done = asyncio.Event()
        number = len(order)
        order.append(number)
        decoding.append((number, done))
        await done.wait()
        decoding.remove((number, done))
        return np.full((3, 224, 224), number, dtype=np.uint8)

    monkeypatch.setattr(serve_module, "run_in_threadpool", decoding_thread)

    async def uploads() -> list:
        requests = []
        for _ in range(24):
            requests.append(
                asyncio.create_task(serve_module.image_from_request(upload(data, state)))
            )
            await settle()  # they arrive in this order
        most = 0
        while decoding:
            most = max(most, len(decoding))
            assert len(decoding) <= 2 and budget.in_use == 9000 * 9000 * len(decoding)
            decoding[0][1].set()  # the oldest decode ends
            await settle()
        assert most == 2
        assert all(request.done() for request in requests)  # none left waiting
        return await asyncio.gather(*requests)

    images = asyncio.run(uploads())
    assert [int(image[0, 0, 0]) for image in images] == list(range(24))  # first come first served
    assert budget.in_use == 0 and not budget.waiting


def test_a_request_given_up_on_keeps_its_pixels_counted_until_its_decoding_ends(monkeypatch):
    """A request that times out (504) or whose client leaves is cancelled: waiting, it leaves the
    line; decoding, its thread runs on, and its pixels stay counted until the thread ends."""
    from litforge.deploy import serve as serve_module

    data = photo(0)  # 640x480
    contract = InputContract(3, 128, (0.5,) * 3, (0.25,) * 3)
    budget = serve_module.DecodeBudget(2 * 640 * 480)
    threads: list[asyncio.Event] = []

    async def decoding_thread(function, contract, data, max_pixels):
        done = asyncio.Event()
        threads.append(done)
        await done.wait()
        return function(contract, data, max_pixels)

    monkeypatch.setattr(serve_module, "run_in_threadpool", decoding_thread)

    async def requests() -> np.ndarray:
        def request():
            return asyncio.create_task(serve_module.prepare_within(budget, contract, data, 10**8))

        first, second, third = request(), request(), request()
        await settle()
        assert len(threads) == 2 and len(budget.waiting) == 1
        third.cancel()  # waiting: out of the line
        await settle()
        assert not budget.waiting and budget.in_use == 2 * 640 * 480
        first.cancel()  # decoding: its thread goes on
        fourth = request()
        await settle()
        assert budget.in_use == 2 * 640 * 480 and len(budget.waiting) == 1
        threads[0].set()  # the given-up request's decoding ends: the fourth's turn
        await settle()
        assert len(threads) == 3 and not budget.waiting
        for done in threads[1:]:
            done.set()
        await settle()
        assert budget.in_use == 0 and first.cancelled() and third.cancelled()
        # (A bound, not a pause: a budget that never grants them would wait forever.)
        return await asyncio.wait_for(asyncio.gather(second, fourth), timeout=60)

    second, fourth = asyncio.run(requests())
    assert second.shape == fourth.shape == (3, 128, 128)


def test_a_request_given_up_on_as_a_decode_ends_takes_no_pixels_with_it():
    """Cancelled while waiting, a request's turn is over at once, but it leaves the line only
    when it runs again: a decode ending in between passes over it, granting it nothing."""
    from litforge.deploy.serve import DecodeBudget

    budget = DecodeBudget(10)

    async def given_up() -> None:
        granted = await budget.acquire(10)
        waiting = asyncio.create_task(budget.acquire(5))
        await settle()
        waiting.cancel()
        budget.release(granted)  # before the cancelled request has run again
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert budget.in_use == 0 and not budget.waiting
        assert await budget.acquire(10) == 10  # the whole budget is there

    asyncio.run(given_up())


def test_a_decode_budget_below_the_largest_image_is_a_one_line_error(tmp_path):
    overrides = ["ckpt_path=a.ckpt", "server.max_decode_pixels=1000000"]
    with pytest.raises(
        UserError,
        match=r"server\.max_decode_pixels=1000000 is below server\.max_image_pixels=89478485",
    ):
        serve(compose_config("serve", tmp_path, overrides))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("top_k=0", "top_k=0: must be > 0."),
        ("server.workers=0", "server.workers=0: must be > 0."),
        ("server.timeout=0", "server.timeout=0: must be > 0."),
        ("server.batch_timeout=-1", "server.batch_timeout=-1: must be >= 0."),
        ("server.max_body_bytes=1e9", "server.max_body_bytes=1000000000.0: must be an integer."),
        ("server.accelerator=tpu", "server.accelerator=tpu: must be one of: auto, cpu, cuda, mps."),
    ],
)
def test_bad_server_settings_are_one_line_errors(tmp_path, override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        serve(compose_config("serve", tmp_path, ["ckpt_path=a.ckpt", override]))
