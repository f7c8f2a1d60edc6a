"""How records show themselves (Jupyter ``_repr_html_``, ``describe()``) without importing the
view stage: records are the bottom layer, so the views register here and records look them up.

`mmpipe.view` registers its renderers when it is imported (``import mmpipe`` imports it), so a
record's ``_repr_html_`` / ``describe`` work in any fresh interpreter::

    register("row_html", row_html)       # done by mmpipe.view
    render("row_html", row)              # done by MultiModalInputs._repr_html_

Kinds: ``"row_html"``, ``"batch_html"``, ``"rollout_html"`` (an HTML fragment of a
`MultiModalInputs`, `BatchedMultiModalInputs`, `RolloutSample`) and ``"describe"`` (plain text
of any of them; takes ``tokenizer=``). Those records take both methods from `Displayed`.
"""

from __future__ import annotations

from typing import Any, Callable

_RENDERERS: dict[str, Callable[..., str]] = {}


def register(kind: str, fn: Callable[..., str]) -> None:
    """Make ``fn(obj, **kwargs) -> str`` the renderer of ``kind`` (a later call replaces it)."""
    _RENDERERS[kind] = fn


def render(kind: str, obj: Any, **kwargs: Any) -> str:
    """``obj`` rendered by the renderer of ``kind``; a `LookupError` naming the fix when none
    is registered (only possible when ``mmpipe.view`` was never imported)."""
    fn = _RENDERERS.get(kind)
    if fn is None:
        raise LookupError(f"no renderer registered for {kind!r}: import mmpipe.view (import mmpipe does it)")
    return fn(obj, **kwargs)


class Displayed:
    """``_repr_html_`` and ``describe`` for a record: the renderers registered for its
    ``_html_kind`` (a class attribute: ``"row_html"``, ``"batch_html"``, ``"rollout_html"``)
    and for ``"describe"``."""

    _html_kind = ""

    def _repr_html_(self) -> str:
        """Jupyter display: the renderer of this record's ``_html_kind`` (`mmpipe.view`: rows
        show thumbnails and the token strip, batches a per-row table, rollouts prompt images
        and prompt + response tokens)."""
        return render(self._html_kind, self)

    def describe(self, *, tokenizer: Any = None) -> str:
        """Plain-text description for terminals (`mmpipe.view.describe`)."""
        return render("describe", self, tokenizer=tokenizer)
