"""Peak memory of one compiled sampled call on the 0.5B (16 rows, 256 new tokens, T 0.7): python sample_memory.py 256 0.7"""
import sys, torch, time, resource
sys.path.insert(0, "/work/main")
import grpo_homework as gh
from pathlib import Path
rss = lambda: int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) // 1024
model, tok = gh.load_model_and_tokenizer("/work/models/qwen2.5-coder-0.5b-instruct", torch.device("cpu"), "float32")
data = gh.TaskDataset("train[:16]", tok, 512, dataset_path="/work/shared/gsm8k", prompt_style="chat", task=gh.TASKS["gsm8k"])
batch = gh.collate_prompts([data[i] for i in range(16)], tok)
model.generate = gh.CompiledGeneration(model, lambda: (16,), everywhere=True)
torch.manual_seed(1)
t0 = time.time()
out = gh.generate_completions(model, tok, batch["input_ids"][:4], batch["attention_mask"][:4], int(sys.argv[1]), float(sys.argv[2]), 4, batch_size=16)
print("done rss MB", rss(), "peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, f"{time.time()-t0:.0f}s", out["completion_lengths"].tolist(), flush=True)
