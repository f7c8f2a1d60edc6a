"""The checks of `mmpipe.cli.demo`: each DataLoader batch against the encoded rows, the
processor's own pixels and (offline tiny model) each row's logits run alone."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

SUMMARY_OK = "unbatch(collate(rows)) == rows: OK"


class DemoChecks:
    """The demo's per-batch checks and its table: what each batch of the DataLoader is held to.

    ``failures[kind]``: messages of the failed checks (kind: unbatch, pixels, logits, loader);
    ``table``: one tuple per row (row, tokens, images, grids, image tokens, uint8 bytes,
    float32 bytes, model stat)."""

    def __init__(self, ds, processor, model, fam, offline: bool):
        self.ds, self.processor, self.model, self.fam, self.offline = ds, processor, model, fam, offline
        self.enc = None  # the encoded dataset as read back from disk: the rows each batch must equal
        self.device = next(model.parameters()).device if model is not None else None
        self.failures: dict[str, list[str]] = {"unbatch": [], "pixels": [], "logits": [], "loader": []}
        self.table: list[tuple] = []
        self.u8_total = self.f32_total = 0
        self.n_batches = 0
        self.checked = {"pixels": False, "logits": False}
        self.t_model = self.t_check = 0.0
        self.row0 = 0

    def batch(self, batch) -> None:
        """Run the model on one batch (if any), check it, add its rows to the table."""
        import torch

        import mmpipe

        self.n_batches += 1
        B = batch.input_ids.shape[0]
        logits = None
        if self.model is not None:
            t1 = time.perf_counter()
            with torch.no_grad():
                out = self.model(**batch.model_inputs(self.device))
            logits = out.logits.detach().cpu()
            self.t_model += time.perf_counter() - t1
        t1 = time.perf_counter()
        row0 = self.row0
        expected = [mmpipe.MultiModalInputs.from_dict(self.enc[row0 + b], row=row0 + b) for b in range(B)]
        # -- unbatch(collate(rows)) == rows
        for b, (g, e) in enumerate(zip(mmpipe.unbatch(batch), expected)):
            if g != e:
                self.failures["unbatch"].append(f"row {row0 + b}: unbatch differs in {g.diff(e)}")
        self._check_pixels(batch, [im for b in range(B) for im in self.ds[row0 + b]["images"]])
        if self.offline and self.model is not None:
            self._check_logits(batch, logits, expected)
        self._add_rows(batch, logits, expected)
        self.t_check += time.perf_counter() - t1
        self.row0 += B

    def _check_pixels(self, batch, raw: list) -> None:
        """pixel_values equal the processor's own output for the batch's raw images."""
        if not raw:
            return
        self.checked["pixels"] = True
        pv, grid = _processor_pixels(self.processor, raw)
        ours = batch.pixel_values.numpy() if batch.pixel_values is not None else None
        k = self.n_batches - 1
        if ours is None or not np.array_equal(grid, batch.image_grid_thw.numpy()) or ours.shape != pv.shape:
            self.failures["pixels"].append(f"batch {k}: pixel_values/image_grid_thw layout differs from the processor's")
        elif not np.array_equal(ours, pv):
            diff = float(np.abs(ours - pv).max())
            strict = self.offline or type(self.processor.image_processor).__name__.endswith("Pil")
            msg = f"batch {k}: pixel_values differ from the processor's by up to {diff:.3g}"
            if strict:
                self.failures["pixels"].append(msg)
            else:
                print(f"note: {msg} (non-PIL image processor backend)")

    def _check_logits(self, batch, logits, expected: list) -> None:
        """Each row alone gives the same logits as in the padded batch (offline tiny model only)."""
        import torch

        import mmpipe

        self.checked["logits"] = True
        L = batch.input_ids.shape[1]
        for b, rec in enumerate(expected):
            alone = mmpipe.collate([rec], processor=self.processor)
            with torch.no_grad():
                la = self.model(**alone.model_inputs(self.device)).logits.detach().cpu()
            n = rec.num_tokens
            lb = logits[b, L - n:] if batch.padding_side == "left" else logits[b, :n]
            if not torch.allclose(lb, la[0], atol=1e-4, rtol=1e-4):
                err = float((lb - la[0]).abs().max())
                self.failures["logits"].append(
                    f"row {self.row0 + b}: logits in the batch differ from the row alone by {err:.3g}")

    def _add_rows(self, batch, logits, expected: list) -> None:
        L = batch.input_ids.shape[1]
        for b, rec in enumerate(expected):
            n = rec.num_tokens
            sl = slice(L - n, L) if batch.padding_side == "left" else slice(0, n)
            u8 = rec.pixel_values_u8.nbytes if rec.pixel_values_u8 is not None else 0
            f32 = rec.num_image_patches * self.fam.patch_dim * 4
            self.u8_total += u8
            self.f32_total += f32
            if logits is not None:
                stat, _ = _row_stats(logits, batch.labels, b, sl)
            else:
                n_t = int((rec.labels != -100).sum()) if rec.labels is not None else 0
                stat = f"{n_t} targets (no model)"
            self.table.append((self.row0 + b, n, rec.num_images, _grids(rec), int((rec.mm_token_type_ids == 1).sum()),
                               u8, f32, stat))

    def summary(self) -> list[str]:
        """The checks line's parts (one per check run)."""
        checks = []
        if self.checked["pixels"]:
            checks.append("pixel_values == processor's: " + ("OK" if not self.failures["pixels"] else "FAILED"))
        if self.checked["logits"]:
            checks.append("batch logits == each row alone: " + ("OK" if not self.failures["logits"] else "FAILED"))
        if self.failures["loader"]:
            checks.append("loader row count: FAILED")
        checks.append(SUMMARY_OK if not self.failures["unbatch"] else "unbatch(collate(rows)) == rows: FAILED")
        return checks


def _grids(rec) -> str:
    return " ".join("x".join(str(int(v)) for v in g) for g in rec.image_grid_thw) or "-"


def _row_stats(logits, labels, b: int, sl: slice) -> tuple[str, Optional[tuple[float, int]]]:
    """Per-row loss (mean CE over the row's target tokens) or, without targets, logit stats."""
    import torch

    lg = logits[b, sl].float()
    if labels is not None:
        lab = labels[b, sl]
        tgt = lab[1:]
        n = int((tgt != -100).sum())
        if n:
            ce = torch.nn.functional.cross_entropy(lg[:-1], tgt, ignore_index=-100, reduction="sum")
            return f"loss {float(ce) / n:.3f} over {n} targets", (float(ce), n)
    return f"logits mean {float(lg.mean()):+.3f} std {float(lg.std()):.3f}", None


def _processor_pixels(processor, images) -> tuple[np.ndarray, np.ndarray]:
    ip = processor.image_processor
    out = ip(images=list(images), return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])
