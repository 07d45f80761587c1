"""Weight sync, LoRA vs full fine-tuning: bytes handed to the engine and seconds per sync,
measured side by side in one run against one local engine.

    .venv/bin/python bench/lora_sync.py [--model smollm2-135m] [--rank 16] [--rounds 3]

Three syncs, interleaved round by round on the same engine:
- "full": a full fine-tuning trainer's `DiskWeightSync.push` (save_pretrained + tokenizer,
  `/update_weights_from_disk`);
- "lora": a LoRA trainer's `AdapterWeightSync.push` (peft's adapter folder, `/load_lora_adapter`
  + `/update_weight_version`);
- "lora_merged": the same LoRA trainer publishing merged full weights (the fallback for engines
  without LoRA routes), for reference.
Seconds are the whole push (write the folder, pause, load, continue), median over the rounds.
Ends with one JSON line; the target: LoRA's sync bytes <= 5% of full's and its seconds lower.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path


async def run(a) -> dict:
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.trainers.engine import EngineServer
    from harnessrl.trainers.lora import LoraConfig
    from harnessrl.trainers.lora_sync import AdapterWeightSync, folder_bytes
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig
    from harnessrl.trainers.weight_sync import DiskWeightSync

    base = dict(model=a.model, device="cpu")
    full_t = TorchTrainer(TorchTrainerConfig(**base))
    lora_t = TorchTrainer(TorchTrainerConfig(**base, lora=LoraConfig(rank=a.rank, alpha=2.0 * a.rank)))
    seconds: dict[str, list[float]] = {"full": [], "lora": [], "lora_merged": []}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, EngineServer(model=a.model, weight_version="0") as engine:
        async with EngineClient(engine.url) as c:
            syncs = {"full": DiskWeightSync(c, Path(tmp) / "full"),
                     "lora": AdapterWeightSync(c, Path(tmp) / "lora"),
                     "lora_merged": AdapterWeightSync(c, Path(tmp) / "merged", adapters=False)}
            for r in range(a.rounds):
                for name, sync in syncs.items():
                    version = await sync.push(full_t if name == "full" else lora_t)
                    seconds[name].append(sync.last_sync_s)
                    folder = Path(tmp) / name.replace("lora_merged", "merged") / f"v{version}"
                    sizes[name] = folder_bytes(folder if name != "lora" else folder.with_name(f"v{version}-lora"))
                    print(f"round {r}  {name:11s}  {sizes[name] / 2**20:9.2f} MiB  {sync.last_sync_s:7.3f} s", flush=True)
            assert syncs["lora"].last_mode == "adapter", "the engine did not take the adapter"
    med = {k: statistics.median(v) for k, v in seconds.items()}
    byte_ratio = sizes["lora"] / sizes["full"]
    speedup = med["full"] / med["lora"]
    print(f"LoRA rank {a.rank}: {sizes['lora'] / 2**20:.2f} MiB vs full {sizes['full'] / 2**20:.2f} MiB "
          f"({byte_ratio:.2%}); sync {med['lora']:.3f} s vs {med['full']:.3f} s ({speedup:.1f}x faster); "
          f"merged fallback {med['lora_merged']:.3f} s")
    target_met = bool(byte_ratio <= 0.05 and med["lora"] < med["full"])
    return {"bench": "lora_sync", "model": a.model, "rank": a.rank, "rounds": a.rounds,
            "bytes": sizes, "seconds_median": {k: round(v, 4) for k, v in med.items()},
            "seconds": {k: [round(x, 4) for x in v] for k, v in seconds.items()},
            "lora_bytes_over_full": round(byte_ratio, 5), "full_seconds_over_lora": round(speedup, 2),
            "target_met": target_met}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
