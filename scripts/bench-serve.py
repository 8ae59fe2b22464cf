#!/usr/bin/env python3
"""Throughput of a running `stagehand serve`, as ratios in one run (BENCHMARKS.md).

    scripts/bench-serve.py --url http://127.0.0.1:8080 --embedder bert --decoder llama

Embeddings: requests/s one request at a time, then the same requests from many
clients at once (the server gathers them into shared steps). Decoding: generated
tokens/s with 1, 4 and 16 concurrent sequences (continuous batching), and the bytes
copied into the device tier per generated token, from the server's own /metrics.
Standard library only; greedy decoding; the decoder should have no end-of-text id
in its config.json so every sequence runs to max_tokens.
"""

import argparse
import concurrent.futures
import json
import time
import urllib.request


def post(url, path, body):
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def metric(url, name, labels):
    text = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{key}="{value}"' in line for key, value in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def run_all(url, path, bodies, clients):
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        answers = list(pool.map(lambda body: post(url, path, body), bodies))
    return answers, time.perf_counter() - started


def embeddings(url, model, count, clients):
    texts = ["a man is eating food", "the cat sits outside", "weights stream from disk", "hello world"]
    bodies = [{"model": model, "input": texts[i % len(texts)] + f" {i}"} for i in range(count)]
    post(url, "/v1/embeddings", bodies[0])  # warm
    _, alone = run_all(url, "/v1/embeddings", bodies, 1)
    batches_before = metric(url, "stagehand_serve_batch_size_sequences_count", {"model": model})
    _, together = run_all(url, "/v1/embeddings", bodies, clients)
    steps = metric(url, "stagehand_serve_batch_size_sequences_count", {"model": model}) - batches_before
    print(f"embeddings {model}: {count} requests, one at a time {count / alone:.1f} req/s; "
          f"{clients} clients {count / together:.1f} req/s in {steps:.0f} steps "
          f"(mean batch {count / max(steps, 1):.1f}); ratio {alone / together:.2f}x")


def stream_completion(url, body):
    """One streamed completion: (tokens, seconds to its first token, seconds to its end)."""
    request = urllib.request.Request(
        url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first, tokens = None, 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if json.loads(line[6:])["choices"][0].get("text"):
                tokens += 1
                first = first if first is not None else time.perf_counter()
    return tokens, first - started, time.perf_counter() - started


def decode(url, model, sequences, tokens):
    """Generated tokens/s with `sequences` concurrent streams: over the whole requests
    (prefill included), and decode alone — each stream's tokens after its first over
    the time from its first token to its end, summed over the streams (they run side by
    side for the whole window, every one to max_tokens)."""
    bodies = [{"model": model, "prompt": f"sequence {i} says", "max_tokens": tokens, "temperature": 0}
              for i in range(sequences)]
    vram = {"to": "vram"}
    moved_before = metric(url, "stagehand_link_transferred_bytes_total", vram)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=sequences) as pool:
        streams = list(pool.map(lambda body: stream_completion(url, body), bodies))
    seconds = time.perf_counter() - started
    moved = metric(url, "stagehand_link_transferred_bytes_total", vram) - moved_before
    generated = sum(count for count, _, _ in streams)
    rate = generated / seconds
    decode_rate = sum((count - 1) / (end - first) for count, first, end in streams if count > 1)
    first_token = max(first for _, first, _ in streams)
    print(f"decode {model}: {sequences:2d} concurrent sequences, {generated} tokens in {seconds:.1f} s: "
          f"{rate:.1f} tokens/s with prefill, {decode_rate:.1f} tokens/s decoding "
          f"(last first token at {first_token:.1f} s), {moved / generated / 2**20:.2f} MiB copied to vram per token")
    return rate, decode_rate


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--embedder")
    parser.add_argument("--decoder")
    parser.add_argument("--embed-requests", type=int, default=256)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--sequences", default="1,4,16")
    args = parser.parse_args()
    if args.embedder:
        embeddings(args.url, args.embedder, args.embed_requests, args.clients)
    if args.decoder:
        post(args.url, "/v1/completions", {"model": args.decoder, "prompt": "warm", "max_tokens": 2})
        rates = {n: decode(args.url, args.decoder, n, args.tokens) for n in map(int, args.sequences.split(","))}
        base = rates[min(rates)]
        print("decode ratios to one sequence, with prefill: "
              + ", ".join(f"{n}: {rate[0] / base[0]:.2f}x" for n, rate in rates.items())
              + "; decoding: " + ", ".join(f"{n}: {rate[1] / base[1]:.2f}x" for n, rate in rates.items()))


if __name__ == "__main__":
    main()
