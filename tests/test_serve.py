"""`python serve.py ckpt_path=...`: real HTTP requests from concurrent clients on 127.0.0.1, bad
uploads answered 4xx while the server keeps serving, and the batched path of the model process."""

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import ROOT, compose_config, free_port

from litforge.errors import UserError
from litforge.inference import InputContract
from litforge.serve import ImageClassifierAPI, serve

LIMIT = 200_000  # server.max_body_bytes of the test server


def post(url: str, body: bytes, content_type: str = "application/octet-stream"):
    """(status, decoded JSON answer) of a POST."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


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


@pytest.fixture(scope="module")
def server(tmp_path_factory, trained_images):
    """serve.py on the trained checkpoint, in its own process group; its URL once healthy."""
    port = free_port()
    log_dir = tmp_path_factory.mktemp("serve")
    process = subprocess.Popen(
        [
            sys.executable,
            "serve.py",
            f"ckpt_path={trained_images.checkpoint}",
            f"server.port={port}",
            f"server.max_body_bytes={LIMIT}",
            "server.batch_timeout=0.05",  # wide enough for the concurrent requests to batch
            "server.accelerator=cpu",
            f"hydra.run.dir={log_dir}",
        ],
        cwd=ROOT,
        stdout=(log_dir / "output.txt").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # up to ~2 minutes for the model process to load
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.read() == b"ok":
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            try:  # the pause between polls, ending early if the server died
                process.wait(timeout=0.2)
                output = (log_dir / "output.txt").read_text()
                pytest.fail(f"serve.py exited {process.returncode}: {output[-3000:]}")
            except subprocess.TimeoutExpired:
                pass
        else:
            pytest.fail("serve.py did not become healthy")
        yield url, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


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
    with pytest.raises(UserError, match="server.host=localhost is not one LitServe binds to"):
        serve(cfg)
