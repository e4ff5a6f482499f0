"""One GRPO update (examples/learning_rl.grpo_update, 1 optimizer step, fresh AdamW) at three learning
rates, on 16 teacher-forced warm-start examples (relu and row_sum, C++, returns 0.3 for the solution, 0
for the broken variants) of a CPU warm start (hidden 128, 2 layers, 200 steps: docs/learning/README.md).
Prints the per-token KL(old || new) on those samples and the mean change of the sequence log-prob
of the solution and of the broken variants. Usage: python examples/lr_probe.py WARM_START_DIR
examples/learning_rl.py was retired when the demo moved to train.py; the probe ran at commit 24702ad.
To run it again: git show 24702ad:examples/learning_rl.py > examples/learning_rl.py (not committed)."""
import sys, random, copy, argparse, torch, json
sys.path.insert(0,'examples'); sys.path.insert(0,'.')
import warm_start as ws, learning_rl, rollout, tasks
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(sys.argv[1]); base = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tt = ws.select_tasks(tasks.load_builtin(), "level1/01_relu,level1/07_row_sum")
a = ws.parse_args(["--out","x","--language","cpp","--later-turn-share","0"])
rng = random.Random(0)
samples = []
for i in range(16):
    t = tt[i % 2]; e = ws.draw_example(t, tok, rng, a)
    ret = 0.3 if e.variant == "correct" else 0.0
    samples.append(rollout.Sample(task_id=t.task_id, trajectory=i, turn=0, prompt_ids=e.prompt_ids,
        completion_ids=e.response_ids, loss_mask=[0]*len(e.prompt_ids)+[1]*len(e.response_ids), logprobs=None,
        text="", truncated=False, status="x", score=ret, discounted_return=ret, speedup=0.0, code=None, feedback=""))
print("correct share", sum(s.score > 0 for s in samples) / 16, flush=True)
def token_lp(model):
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.input_ids]); lp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
            out.append(lp[len(s.prompt_ids)-1:])
    return out
ref = token_lp(base)
args = argparse.Namespace(micro_batch=8, optimizer_steps=1, max_new_tokens=1024, temperature=1.0, clip_low=0.2, clip_high=0.28, grad_clip=1.0, seed=0)
for lr in (3e-4, 1e-4, 3e-5):
    m = copy.deepcopy(base); opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    learning_rl.grpo_update(m, opt, samples, args, torch.device("cpu"))
    new = token_lp(m)
    kl = torch.cat([(r.exp() * (r - n)).sum(-1) for r, n in zip(ref, new)]).mean().item()
    dlp = [float((n.gather(-1, torch.tensor(s.completion_ids)[:, None]) - r.gather(-1, torch.tensor(s.completion_ids)[:, None])).sum()) for s, r, n in zip(samples, ref, new)]
    good = [d for d, s in zip(dlp, samples) if s.score > 0]; bad = [d for d, s in zip(dlp, samples) if s.score == 0]
    print(json.dumps({"lr": lr, "kl_old_new_per_token": round(kl, 4), "dlogp_correct_mean": round(sum(good)/len(good), 3), "dlogp_broken_mean": round(sum(bad)/len(bad), 3)}), flush=True)
