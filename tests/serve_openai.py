"""The official `openai` client against a running `stagehand serve`.

Run by tests/serve_openai.rs as `python tests/serve_openai.py BASE_URL API_KEY`: the
server serves `bert` (an encoder) and `llama` (a decoder with a chat template),
perhaps each with an adapter `style` (`bert:style`, `llama:style`: the adapter
checks run when the models list names them). Every check asserts; the last line
says how many passed.
"""

import math
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=120)
checks = []


def check(name):
    def run(function):
        function()
        checks.append(name)
        print(f"ok: {name}", flush=True)
        return function

    return run


ids = sorted(model.id for model in client.models.list())
adapters = "llama:style" in ids


@check("models.list names both models (and their adapters)")
def _():
    expected = ["bert", "bert:style", "llama", "llama:style"] if adapters else ["bert", "llama"]
    assert ids == expected, ids


@check("embeddings: a list, in the client's default base64 and as floats, agree")
def _():
    texts = ["a man is eating food", "the cat sits outside"]
    encoded = client.embeddings.create(model="bert", input=texts)
    floats = client.embeddings.create(model="bert", input=texts, encoding_format="float")
    assert len(encoded.data) == 2 and [d.index for d in encoded.data] == [0, 1]
    for a, b in zip(encoded.data, floats.data):
        assert len(a.embedding) == len(b.embedding) > 0
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6
        norm = math.sqrt(sum(x * x for x in a.embedding))
        assert abs(norm - 1.0) < 1e-4, norm  # the folder's Normalize module
    assert encoded.usage.prompt_tokens == encoded.usage.total_tokens > 0
    assert encoded.model == "bert"


@check("completions: greedy text repeats, max_tokens and usage hold")
def _():
    ask = dict(model="llama", prompt="hello", max_tokens=5, temperature=0)
    first = client.completions.create(**ask)
    second = client.completions.create(**ask)
    assert first.choices[0].text == second.choices[0].text
    assert first.usage.completion_tokens <= 5
    assert first.choices[0].finish_reason in ("length", "stop")


@check("chat: an answer from the assistant, the same text streamed with usage")
def _():
    messages = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model="llama", messages=messages, max_tokens=5, temperature=0)
    answer = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="llama", messages=messages, max_tokens=5, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    text, usage, reasons = "", None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert text == answer, (text, answer)
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert reasons == [whole.choices[0].finish_reason], reasons


@check("completions stream: the text of the whole answer")
def _():
    ask = dict(model="llama", prompt="hello", max_tokens=4, temperature=0)
    whole = client.completions.create(**ask).choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **ask) if chunk.choices)
    assert streamed == whole, (streamed, whole)


@check("errors: unknown model is NotFoundError with code model_not_found")
def _():
    try:
        client.embeddings.create(model="nope", input="x")
    except openai.NotFoundError as error:
        assert error.status_code == 404 and error.code == "model_not_found", error
    else:
        raise AssertionError("no error")


@check("errors: an unsupported field is BadRequestError naming its param")
def _():
    try:
        client.completions.create(model="llama", prompt="x", n=2)
    except openai.BadRequestError as error:
        assert error.status_code == 400 and error.param == "n", error
        assert "not supported" in error.message
    else:
        raise AssertionError("no error")


@check("errors: chat on the encoder is BadRequestError naming the model")
def _():
    try:
        client.chat.completions.create(model="bert", messages=[{"role": "user", "content": "x"}])
    except openai.BadRequestError as error:
        assert error.param == "model" and "encoder" in error.message, error
    else:
        raise AssertionError("no error")


@check("errors: a wrong key is AuthenticationError")
def _():
    wrong = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    try:
        wrong.models.list()
    except openai.AuthenticationError as error:
        assert error.status_code == 401 and error.code == "invalid_api_key", error
    else:
        raise AssertionError("no error")


if adapters:

    @check("a LoRA per request: model:adapter answers under its own id, differently from the base")
    def _():
        ask = dict(prompt="hello", max_tokens=6, temperature=0)
        base = client.completions.create(model="llama", **ask)
        styled = client.completions.create(model="llama:style", **ask)
        again = client.completions.create(model="llama:style", **ask)
        assert styled.model == "llama:style" and base.model == "llama", (styled.model, base.model)
        assert styled.choices[0].text == again.choices[0].text
        assert styled.choices[0].text != base.choices[0].text, styled.choices[0].text
        messages = [{"role": "user", "content": "hi"}]
        chat = client.chat.completions.create(model="llama:style", messages=messages, max_tokens=4, temperature=0)
        assert chat.model == "llama:style" and chat.choices[0].message.role == "assistant"
        texts = ["a man is eating food"]
        plain = client.embeddings.create(model="bert", input=texts, encoding_format="float")
        styled = client.embeddings.create(model="bert:style", input=texts, encoding_format="float")
        assert styled.model == "bert:style"
        moved = max(abs(a - b) for a, b in zip(plain.data[0].embedding, styled.data[0].embedding))
        assert moved > 1e-3, moved
        try:
            client.completions.create(model="llama:nope", prompt="x", max_tokens=1)
        except openai.NotFoundError as error:
            assert error.code == "model_not_found" and "llama:style" in error.message, error
        else:
            raise AssertionError("no error")


print(f"openai-client: {len(checks)} checks passed (openai {openai.__version__})")
