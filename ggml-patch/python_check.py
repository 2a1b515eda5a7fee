"""Greedy tokens from llama-cpp-python (`from llama_cpp import Llama`), for python.sh.

    python python_check.py MODEL.gguf [N_TOKENS] [THREADS]
    python python_check.py --compare PLAIN.json PLUGIN.json

Prints one JSON line: the ids of N greedy tokens after a fixed prompt and the logits of the first
sampling step. python.sh runs it once with the ork-moe plugin (ORK_MOE_PLUGIN) and once without
(ORK_MOE=0); --compare exits 1 unless the token ids are equal, and prints how far the logits moved.
(verbose=True: with verbose=False llama-cpp-python silences stderr while it loads the model, and
with it the hook's "ork-moe: plugin active" line.)
"""

import json
import sys

from llama_cpp import Llama


def compare(plain_path: str, plugin_path: str) -> int:
    plain, plugin = (json.load(open(p)) for p in (plain_path, plugin_path))
    delta = max(abs(a - b) for a, b in zip(plain["logits"], plugin["logits"]))
    span = max(plain["logits"]) - min(plain["logits"])
    same = plain["tokens"] == plugin["tokens"]
    print(
        f"{'identical' if same else 'DIFFERENT'} greedy token ids ({len(plain['tokens'])}, "
        f"{len(set(plain['tokens']))} distinct); first-step logits: max |plugin - plain| {delta:.3g} "
        f"over a range of {span:.3g}"
    )
    return 0 if same else 1


def main() -> None:
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    model = sys.argv[1]
    n_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    llm = Llama(model_path=model, n_ctx=256, n_batch=64, n_threads=threads, seed=1, logits_all=True, verbose=True)
    prompt = llm.tokenize(b"The quick brown fox")
    llm.eval(prompt)
    logits = [float(x) for x in llm.scores[len(prompt) - 1]]
    ids = []
    # temp=0 selects llama.cpp's greedy sampler; the other samplers are neutral.
    for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        ids.append(int(tok))
        if len(ids) == n_tokens:
            break
    print(json.dumps({"prompt": len(prompt), "tokens": ids, "logits": logits}))


if __name__ == "__main__":
    main()
