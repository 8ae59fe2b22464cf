#!/usr/bin/env python3
"""PyTorch's side of BENCHMARKS.md "Compute against PyTorch on the CPU backend".

Times the same work stagehand's CPU backend does, on the same weights, with PyTorch
from PyPI (torch, transformers, sentence-transformers), each case after a warm-up:

  decode   greedy decode of a Llama folder in bf16: ms per token after the prefill
  prefill  one forward pass over a prompt of N tokens (the logits of its last token)
  minilm   sentence-transformers `encode` of 512 varied sentences at batch 32

Usage (PyTorch lives in a venv outside the repository; CI never runs this):

  python3 -m venv /work/venv
  /work/venv/bin/pip install torch transformers sentence-transformers safetensors tokenizers
  /work/venv/bin/python scripts/peer-bench.py decode  --model DIR [--tokens 32] [--threads 2]
  /work/venv/bin/python scripts/peer-bench.py prefill --model DIR [--prompt-tokens 265]
  /work/venv/bin/python scripts/peer-bench.py minilm  --model DIR [--texts-out FILE]
  /work/venv/bin/python scripts/peer-bench.py sentences --texts-out FILE

`--device cuda` runs decode and prefill on the GPU (scripts/gpu-check.sh does, with the
machine's own PyTorch), synchronising the device around every timing.

`sentences` (and `minilm --texts-out`) writes the 512 sentences one per line, so that
`stagehand embed --file FILE` embeds exactly the same texts. Every case prints one JSON
line with its figures.
"""

import argparse
import json
import random
import time

WORDS = (
    "the a one every small large quiet bright model weight stream block copy disk "
    "memory token prompt layer head river mountain city garden window morning night "
    "reads writes moves keeps holds waits runs turns finds shows makes takes gives "
    "quickly slowly often never always again together apart under over between "
    "through before after because while although if when where which that this"
).split()


def sentences(count=512, seed=22):
    """`count` sentences of 6–24 words, deterministic for a seed."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        length = rng.randint(6, 24)
        words = [rng.choice(WORDS) for _ in range(length)]
        texts.append(" ".join(words).capitalize() + ".")
    return texts


def setup_torch(threads):
    import torch

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    return torch


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def load_decoder(torch, args):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model.to(args.device)
    model.eval()
    ids = torch.tensor([prompt_ids(args.prompt_tokens)], device=args.device)
    return model, ids


def timed(torch, device, work):
    synchronize(torch, device)
    start = time.perf_counter()
    work()
    synchronize(torch, device)
    return time.perf_counter() - start


def prompt_ids(count):
    # Token ids 1000.. are ordinary vocabulary in any Llama-sized tokenizer; the
    # figures depend on the prompt's length, not its content.
    return [1000 + (7 * index) % 20000 for index in range(count)]


def case_decode(args):
    torch = setup_torch(args.threads)
    model, ids = load_decoder(torch, args)

    def generate(tokens):
        return lambda: model.generate(ids, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)

    # Warm-up: one short generation.
    timed(torch, args.device, generate(4))
    prefill_seconds = timed(torch, args.device, generate(1))
    total = timed(torch, args.device, generate(args.tokens))
    per_token = (total - prefill_seconds) / (args.tokens - 1)
    return {
        "case": "decode",
        "device": args.device,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "tokens": args.tokens,
        "ms_per_token": round(per_token * 1e3, 3),
        "dtype": "bf16",
    }


def case_prefill(args):
    torch = setup_torch(args.threads)
    model, ids = load_decoder(torch, args)
    timed(torch, args.device, lambda: model(ids, logits_to_keep=1))
    best = min(
        timed(torch, args.device, lambda: model(ids, logits_to_keep=1)) for _ in range(args.repeats)
    )
    return {
        "case": "prefill",
        "device": args.device,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "seconds_best": round(best, 5),
        "repeats": args.repeats,
        "dtype": "bf16",
    }


def case_minilm(args):
    setup_torch(args.threads)
    from sentence_transformers import SentenceTransformer

    texts = sentences()
    if args.texts_out:
        write_texts(args.texts_out, texts)
    model = SentenceTransformer(args.model, device="cpu")
    model.encode(texts[:64], batch_size=32)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        model.encode(texts, batch_size=32)
        best = min(best, time.perf_counter() - start)
    return {
        "case": "minilm",
        "threads": args.threads,
        "texts": len(texts),
        "batch": 32,
        "seconds_best": round(best, 3),
        "repeats": args.repeats,
    }


def write_texts(path, texts):
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(texts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["decode", "prefill", "minilm", "sentences"])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=265)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--texts-out")
    args = parser.parse_args()
    if args.case == "sentences":
        write_texts(args.texts_out, sentences())
        print(json.dumps({"case": "sentences", "texts": 512, "file": args.texts_out}))
        return
    if not args.model:
        parser.error("--model DIR is needed for " + args.case)
    result = {"decode": case_decode, "prefill": case_prefill, "minilm": case_minilm}[args.case](args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
