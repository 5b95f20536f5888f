"""Several Tinker clients on one base: their requests batched (one forward / one engine call over
every client's data, each row with its own LoRA adapter) vs run one by one (each request alone,
its adapter active), side by side in one run.

Four LoRA clients (rank 16, their B matrices random so that the adapters differ) on a tiny random
Llama and on a random model of SmolLM2-135M's shape (30 layers, hidden 576, vocabulary 49152; no
download). Per round, every client sends one `forward_backward` (importance sampling over
`--data` sequences of `--tokens` tokens) and one `sample` (`--samples` samples of `--new` tokens
from a 16-token prompt, its own seed). Timed at the host, where the server's queue hands over
the requests that waited together (`ModelHost.forward_backward_many`, `ModelHost.sample`); the two
ways alternate round by round, and each one's fastest round (the least disturbed on a shared machine)
is printed, with the throughput ratio.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/tinker_multitenant.py [--rounds 5] [--models tiny smollm2-shape]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from rlhfkit.models.memory import SMOLLM2_CONFIG
from rlhfkit.models.tiny import tiny_model_and_tokenizer, tiny_tokenizer
from rlhfkit.serving.tinker.host import ModelHost
from rlhfkit.serving.tinker.wire import FwdBwdRequest, SampleOptions, WireDatum

CLIENTS = 4


def smollm2_shape():
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    cfg = {k: v for k, v in SMOLLM2_CONFIG.items() if k != "attention_bias"}
    with no_init_weights():  # transformers' own init of 135M weights takes minutes on a shared 2-core CPU
        model = LlamaForCausalLM(LlamaConfig(**cfg, rms_norm_eps=1e-5, rope_theta=100000.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:  # the norms are ones
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    tok = tiny_tokenizer()  # pad and EOS ids only: the prompts are random ids of the model's vocabulary
    return model, tok


def build(name: str, root: str) -> tuple[ModelHost, int]:
    model, tok = tiny_model_and_tokenizer(seed=0) if name == "tiny" else smollm2_shape()
    host = ModelHost(model.eval(), tok, name, root, torch.device("cpu"), default_rank=16)
    gen = torch.Generator().manual_seed(1)
    for k in range(CLIENTS):
        host.create_model(f"client{k}", 16, seed=k)
    with torch.no_grad():
        for n, p in host.peft.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    return host, model.config.vocab_size


def workload(host: ModelHost, vocab: int, args) -> tuple[list[FwdBwdRequest], list[str], list[list[int]]]:
    rng = np.random.default_rng(0)
    requests = []
    for k in range(CLIENTS):
        data = []
        for _ in range(args.data):
            tokens = rng.integers(3, vocab, args.tokens + 1).tolist()
            data.append(WireDatum(tokens[:-1], {"target_tokens": np.asarray(tokens[1:]),
                                                "logprobs": np.full(args.tokens, -5.0, np.float32),
                                                "advantages": rng.normal(size=args.tokens).astype(np.float32)}))
        requests.append(FwdBwdRequest(f"client{k}", 0, "importance_sampling", {}, False, data))
    sessions = [host.create_sampler(host.save_for_sampler(f"client{k}", "bench")) for k in range(CLIENTS)]
    prompts = [rng.integers(3, vocab, 16).tolist() for _ in range(CLIENTS)]
    return requests, sessions, prompts


def clear(host: ModelHost) -> None:
    for m in host.models.values():
        for p in m.learner.params:
            p.grad = None


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(name: str, args) -> None:
    with tempfile.TemporaryDirectory() as root:
        host, vocab = build(name, root)
        requests, sessions, prompts = workload(host, vocab, args)
        params = {"max_tokens": args.new, "temperature": 1.0, "stop": []}
        seeds = list(range(CLIENTS))

        def fb_batched():
            host.forward_backward_many(requests)

        def fb_alone():
            for r in requests:
                host.forward_backward_many([r])

        def sample_batched():
            host.sample(sessions, prompts, args.samples, params, seeds, [SampleOptions()] * CLIENTS)

        def sample_alone():
            for k in range(CLIENTS):
                host.sample([sessions[k]], [prompts[k]], args.samples, params, [seeds[k]], [SampleOptions()])

        times: dict[str, list[float]] = {k: [] for k in ("fb batched", "fb alone", "sample batched", "sample alone")}
        for r in range(args.rounds + 1):  # round 0 warms up, untimed
            order = [("fb batched", fb_batched), ("fb alone", fb_alone), ("sample batched", sample_batched),
                     ("sample alone", sample_alone)]
            for key, fn in order if r % 2 else order[::-1]:
                t = timed(fn)
                clear(host)
                if r:
                    times[key].append(t)
            if r:
                print(f"  {name} round {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
        med = {k: min(v) for k, v in times.items()}  # the fastest round: the least disturbed by other jobs
        tokens = CLIENTS * args.data * args.tokens
        print(f"{name}: forward_backward of {CLIENTS} clients x {args.data} x {args.tokens} tokens: "
              f"batched {med['fb batched']:.3f} s, one by one {med['fb alone']:.3f} s "
              f"({tokens / med['fb batched']:.0f} vs {tokens / med['fb alone']:.0f} tokens/s): "
              f"x{med['fb alone'] / med['fb batched']:.2f}", flush=True)
        print(f"{name}: sample of {CLIENTS} clients x {args.samples} samples x {args.new} tokens: "
              f"batched {med['sample batched']:.3f} s, one by one {med['sample alone']:.3f} s: "
              f"x{med['sample alone'] / med['sample batched']:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-shape"], choices=["tiny", "smollm2-shape"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", type=int, default=4, help="sequences per forward_backward request")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--samples", type=int, default=4, help="samples per sample request")
    parser.add_argument("--new", type=int, default=32, help="new tokens per sample")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for name in args.models:
        run(name, args)


if __name__ == "__main__":
    main()
