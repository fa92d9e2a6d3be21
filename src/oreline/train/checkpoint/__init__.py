"""Checkpoints: the format, writing, reading, resume rules and async save, one module per concept.

Layout under `<run>/checkpoints/`:

    step-00000200/          a full, resumable checkpoint
      .metadata  __0_0.distcp ...   model + optimizer tensors (torch.distributed.checkpoint, one file per rank)
      meta.json             step, tokens, schedule, loader, RNG, stability window, config + fingerprints,
                            model_args, tokenizer_dir, world size, time, optimizer hyperparameters
      rng-rank00001.json    RNG states of ranks > 0 (rank 0's are in meta.json)
      checksums.json        size + xxh3-128 of every file above, and a hash of itself
      signature.json        HMAC of checksums.json, only with ORELINE_CHECKPOINT_KEY set
    model-step-00000100/    model-only snapshot (model.safetensors + meta.json): for eval/export, never resumed
    latest                  a small file holding the newest complete checkpoint's name

The modules, by the question each answers (import them directly: this file re-exports nothing):

- `format`: what is on disk — folder names, meta.json, `latest`, checksums.json written, listing.
  No torch, so `oreline doctor` can use it (and `verify`) anywhere.
- `verify`: is this folder intact — every byte against the manifest, the DCP index checked through
  the safe unpickler, the signature when a key is set; once per process; signing a verified one.
- `signature`: the HMAC-SHA256 of the manifest (ORELINE_CHECKPOINT_KEY, docs/checkpoint-security.md).
- `metadata`: DCP's `.metadata` read by an allow-listed unpickler, never `pickle.load`.
- `raw_tensors`: the DCP storage layer that writes tensors as raw bytes (hashing them while
  writing) and reads them back into place.
- `save`: where a checkpoint gets written — `save_checkpoint` (atomic publish: `.tmp-` folder,
  fsync, rename, `latest`), model-only snapshots, retention.
- `async_save`: the save a process may have in flight (`checkpoint.async`, CUDA) and
  `wait_for_pending_save`.
- `load`: reading — `load_checkpoint` into a live model and optimizer, `load_model_state` for
  eval/export, `resolve_checkpoint` (which checkpoint a run directory means).
- `resume`: which checkpoint a run continues from (`find_resumable`, the one search, which
  accounts for a save in flight) and whether its config may differ (`check_resume_compatible`).
- `rng`: RNG states as JSON.
- `dcp_calls`: how the modules above call DCP (with or without a process group, its warnings,
  its wrapped load errors).
- `commands`: `oreline checkpoint ls | verify | sign | inspect`.

Dependencies point one way: format ← verify ← resume ← load; save and load sit on raw_tensors,
dcp_calls and async_save; commands on everything. How the training loop uses checkpoints (their
meta, resuming, rolling back) is `oreline.train.recovery`.
"""
