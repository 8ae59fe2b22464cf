"""The official `openai` client's images API against a running `stagehand serve`.

Run by tests/serve_openai.rs as `python tests/serve_openai_images.py BASE_URL API_KEY`:
the server serves `flux-tiny`, the tiny Flux pipeline of tests/fixtures/pipeline.
Every check asserts; the last line says how many passed.
"""

import base64
import struct
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=300)
checks = []
SMALL = {"seed": 3, "num_inference_steps": 1, "max_sequence_length": 16}


def check(name):
    def run(function):
        function()
        checks.append(name)
        print(f"ok: {name}", flush=True)
        return function

    return run


def png_size(data):
    """Width and height of a PNG's IHDR."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


@check("images.generate gives n base64 PNGs of the size asked, the same for the same seed")
def _():
    first = client.images.generate(
        model="flux-tiny", prompt="a red fox in the snow", n=2, size="48x64",
        response_format="b64_json", extra_body=SMALL,
    )
    assert len(first.data) == 2, first
    pngs = [base64.b64decode(image.b64_json) for image in first.data]
    assert all(png_size(png) == (48, 64) for png in pngs), [png_size(png) for png in pngs]
    assert pngs[0] != pngs[1], "image 2 takes seed + 1"
    again = client.images.generate(
        model="flux-tiny", prompt="a red fox in the snow", n=1, size="48x64",
        response_format="b64_json", extra_body=SMALL,
    )
    assert base64.b64decode(again.data[0].b64_json) == pngs[0], "same request, same bytes"


@check("a url response, a size above the limit and a text model's endpoint are 400s naming them")
def _():
    for kwargs, needle in [
        ({"response_format": "url"}, "url"),
        ({"size": "4096x4096"}, "max_image_pixels"),
        ({"size": "50x50"}, "multiples of 16"),
        ({"n": 9}, "max_images"),
    ]:
        try:
            client.images.generate(model="flux-tiny", prompt="x", extra_body=SMALL, **kwargs)
        except openai.BadRequestError as error:
            assert needle in str(error), (needle, str(error))
        else:
            raise AssertionError(f"{kwargs} was accepted")
    try:
        client.embeddings.create(model="flux-tiny", input="x")
    except openai.BadRequestError as error:
        assert "makes images" in str(error), str(error)
    else:
        raise AssertionError("embeddings from an image model were accepted")


print(f"openai-client: {len(checks)} checks passed")
