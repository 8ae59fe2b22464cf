"""The official `openai` client's videos API against a running `stagehand serve`.

Run by tests/serve_openai.rs as `python tests/serve_openai_videos.py BASE_URL API_KEY`:
the server serves `wan_pipeline` and `wan_i2v_pipeline`, the tiny Wan 2.2 text- and
image-to-video pipelines of tests/fixtures. The client sends `videos.create` as
multipart/form-data (its fields as text, the extensions through `extra_body`, the
image as the `input_reference` file part). Every check asserts; the last line says
how many passed.
"""

import pathlib
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=300)
checks = []
MODEL = "wan_pipeline"
I2V_MODEL = "wan_i2v_pipeline"
FIRST = pathlib.Path(__file__).parent / "fixtures" / "wan_i2v_pipeline" / "first.png"
SMALL = {"num_inference_steps": 1, "max_sequence_length": 16, "guidance_scale": 1, "seed": 3}


def check(name):
    def run(function):
        function()
        checks.append(name)
        print(f"ok: {name}", flush=True)
        return function

    return run


@check("videos.create answers a queued job; create_and_poll completes it; the MP4 downloads")
def _():
    video = client.videos.create(
        model=MODEL, prompt="a red fox in the snow", seconds="0.25", size="48x64", extra_body=SMALL,
    )
    assert video.object == "video" and video.status == "queued", video
    assert video.size == "48x64" and video.seconds == "0.25", video
    done = client.videos.poll(video.id, poll_interval_ms=50)
    assert done.status == "completed" and done.progress == 100, done
    mp4 = client.videos.download_content(done.id).read()
    assert mp4[4:8] == b"ftyp", mp4[:16]
    again = client.videos.create_and_poll(
        model=MODEL, prompt="a red fox in the snow", seconds="0.25", size="48x64",
        extra_body=SMALL, poll_interval_ms=50,
    )
    assert client.videos.download_content(again.id).read() == mp4, "same request, same bytes"


@check("videos.list pages the jobs kept; videos.delete removes one, then it is not found")
def _():
    listed = client.videos.list(limit=1, order="desc")
    assert len(listed.data) == 1 and listed.has_more, listed
    ids = [video.id for video in client.videos.list(order="asc")]
    assert len(ids) == 2, ids
    deleted = client.videos.delete(ids[0])
    assert deleted.deleted and deleted.id == ids[0], deleted
    try:
        client.videos.retrieve(ids[0])
    except openai.NotFoundError as error:
        assert "no video" in str(error), str(error)
    else:
        raise AssertionError("a deleted video was found")


@check("videos.create_and_poll with input_reference=open(PNG) makes the image-to-video model's MP4")
def _():
    with open(FIRST, "rb") as image:
        done = client.videos.create_and_poll(
            model=I2V_MODEL, prompt="the fox turns its head", input_reference=image,
            seconds="0.25", size="48x64", extra_body=SMALL, poll_interval_ms=50,
        )
    assert done.status == "completed" and done.size == "48x64", done
    assert client.videos.download_content(done.id).read()[4:8] == b"ftyp"


@check("a size or length past its limit and a wrong or missing image are 400s naming them")
def _():
    png = FIRST.read_bytes()
    for model, kwargs, needle in [
        (MODEL, {"size": "50x50"}, "multiples of 16"),
        (MODEL, {"size": "4096x4096"}, "max_video_pixels"),
        (MODEL, {"seconds": "60"}, "max_video_frames"),
        (MODEL, {"size": "48x64", "input_reference": FIRST}, "takes no input_reference"),
        (I2V_MODEL, {"size": "48x64"}, "the image is required"),
        (I2V_MODEL, {"size": "64x64", "input_reference": png}, "input_reference is 48x64"),
        (I2V_MODEL, {"size": "48x64", "input_reference": ("a.jpg", b"\xff\xd8", "image/jpeg")}, "is not a PNG"),
    ]:
        try:
            client.videos.create(model=model, prompt="x", extra_body=SMALL, **kwargs)
        except openai.BadRequestError as error:
            assert needle in str(error), (needle, str(error))
        else:
            raise AssertionError(f"{kwargs} was accepted")


print(f"openai-client: {len(checks)} checks passed")
