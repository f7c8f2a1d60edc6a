"""The errors mmpipe raises for bad input, one class per kind of mistake.

Every error names where it happened (row, column, image), the stage, what was expected,
what was found and what to do; the message is composed from those attributes so a
program can read them and a person can read the message::

    try:
        mmpipe.encode_row(row, processor, idx=7)
    except mmpipe.errors.InputError as e:
        e.row, e.stage, e.column, e.expected, e.found, e.fix

All subclass ``ValueError`` (a bad value was passed in), so ``except ValueError`` keeps
working. ``encode(..., on_error="skip")`` records ``e.stage`` and ``str(e)`` for the row.

Stages (`STAGES`): ``"parse"`` (raw row -> messages/images), ``"image"`` (decode, resize),
``"template"`` (chat template, placeholders vs image tokens), ``"truncate"`` (max_length),
``"collate"`` (rows -> batch), ``"validate"`` (record/schema checks), ``"encode"`` (any
other failure inside encode, wrapped under ``on_error="skip"``), ``"rollout"`` (rollout inputs,
engine outputs, multi-turn appends, ReMA episodes).

Bad *arguments* (a programmer error, not bad data: an unknown option value, a negative size)
raise `ArgumentError`, also a ``ValueError``, whose message names the argument, what it
accepts and what was given.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

from mmpipe.error_text import (MESSAGE_FIELDS, fields_from_message, keep_fields, message_fields, note_fields,
                               split_fields_note, worker_original)

STAGES = ("parse", "image", "audio", "template", "truncate", "collate", "validate", "encode", "rollout")


class MMPipeError(Exception):
    """Base of every error mmpipe raises on purpose.

    Pickles with its message and every attribute (``row``, ``class_name``, ``layer_type``, ...)
    whatever its ``__init__`` takes, so it crosses process boundaries intact: ``datasets.map(
    num_proc=...)`` workers (a worker's error that cannot be unpickled hangs the pool), spawn /
    forkserver DataLoader workers, Ray. Subclasses need no ``__reduce__`` of their own. A torch
    DataLoader's re-raise, ``type(e)(text)``, builds one whose fields are read back from the worker's
    text (`InputError`'s message; a subclass's own fields from their note: `keep_fields`).
    """

    def __reduce__(self):
        return (_restore, (type(self), self.args), dict(vars(self)))

    def keep_fields(self, text: Any, **fields) -> None:
        """`mmpipe.error_text.keep_fields` on this error: ``fields`` set, and noted so that they cross
        a torch DataLoader worker (taken back from ``text`` when the DataLoader rebuilds it)."""
        keep_fields(self, text, **fields)


def _restore(cls, args):
    """An instance of ``cls`` with ``args`` and no ``__init__`` run (pickle then sets its
    ``__dict__``): a subclass whose ``__init__`` takes other arguments than its message loads too."""
    e = cls.__new__(cls)
    e.args = args
    return e


class ArgumentError(MMPipeError, ValueError):
    """A bad argument (programmer error): the message names the argument, the accepted values
    and what was passed, e.g. ``truncation must be one of ('raise', 'drop', 'truncate_text'),
    got 'cut'``."""


class InputError(MMPipeError, ValueError):
    """Bad input data, located and explained.

    Attributes:
        row: dataset row index (None when unknown: pass ``with_indices=True`` to map), or
            the row's index in the batch for collate errors.
        column: the column (or record field) holding the bad value, e.g. ``"images"``.
        stage: one of `STAGES`.
        expected / found: short descriptions (strings) of what should be there and what is.
        fix: what the user can do about it.
        image: index of the image within the row, when an image is at fault.
        detail: the free text of the message when it is not expected/found shaped.
        column_in_location: the location names the column (``"row 3, column 'pixel_values'"``,
            or ``"column 'pixel_values'"`` when the row is unknown) instead of the closing tag,
            for errors about one stored column of a row.
    """

    default_stage = "parse"

    def __init__(
        self,
        detail: str = "",
        *,
        row: Optional[int] = None,
        column: Optional[str] = None,
        stage: Optional[str] = None,
        expected: Any = None,
        found: Any = None,
        fix: Optional[str] = None,
        image: Optional[int] = None,
        where: Optional[str] = None,
        column_in_location: bool = False,
    ):
        self.detail = detail
        self.row = row
        self.column = column
        self.stage = stage or self.default_stage
        self.expected = expected
        self.found = found
        self.fix = fix
        self.image = image
        self.where = where
        self.column_in_location = column_in_location
        self.worker_text: Optional[str] = None  # a DataLoader's re-raise: the worker's text, the message
        if row is None and column is None and stage is None and image is None:
            self._locate_from_worker_text()
        super().__init__(self._compose())
        if self.worker_text is None:
            self._note_if_ambiguous()

    def _note_if_ambiguous(self) -> None:
        """Note ``detail`` / ``expected`` / ``found`` / ``fix`` (`note_fields`) when the message does not
        give them back (`fields_from_message`: a found text holding `` - ``, a fix holding ``; found``):
        a DataLoader worker's re-raise then takes them from the note."""
        said = {k: getattr(self, k) for k in MESSAGE_FIELDS}
        texts = [str(v) for v in said.values() if v is not None]
        if not (any(m in t for t in texts for m in _SPLITS) or self.detail.startswith(("row ", "column "))):
            return  # no text the parse could split wrongly: it gives them back
        back = fields_from_message(type(self), self._compose()) or {}
        if any(back.get(k) != (None if v is None else str(v)) for k, v in said.items()):
            note_fields(self, **said)

    def _locate_from_worker_text(self) -> None:
        """A torch DataLoader worker's error reaches the main process as its type and text only
        (``type(e)("Caught ... in DataLoader worker process N. Original Traceback ...")``): take
        every field back from the original message (`fields_from_message`: the fields whose message
        composes to it) and from its fields note (`note_fields`: a subclass's own fields);
        ``worker_text`` keeps the worker's text, which stays the message. A no-op for any other detail."""
        original = worker_original(self.detail, type(self))
        if original is None:
            return
        message, noted = split_fields_note(original)
        fields = message_fields(type(self), message)
        self.worker_text = self.detail
        if any(k in noted for k in MESSAGE_FIELDS):  # the message was ambiguous: the note says them all
            fields.update((k, noted.get(k, fields.get(k))) for k in MESSAGE_FIELDS)
        for k, v in {**fields, **noted}.items():
            setattr(self, k, v)

    def location(self) -> str:
        """``"row 3, image 1"`` (or the caller's own `where` text; ``where=""``: none, the
        detail already says where)."""
        if self.where is not None:
            return self.where
        if self.column_in_location and self.column is not None:
            return (f"row {self.row}, " if self.row is not None else "") + f"column {self.column!r}"
        if self.row is None and self.image is None:  # nothing known (e.g. re-raised by a DataLoader worker)
            return ""
        loc = f"row {self.row}" if self.row is not None else "row (index unknown: pass with_indices=True to map)"
        return loc + (f", image {self.image}" if self.image is not None else "")

    def message_body(self) -> str:
        """What is wrong, without location, fix or tags: ``"detail; expected X; found Y"``
        (for reports that say where and what to do themselves, e.g. `mmpipe.validate_dataset`)."""
        body = [self.detail] if self.detail else []
        if self.expected is not None:
            body.append(f"expected {self.expected}")
        if self.found is not None:
            body.append(f"found {self.found}")
        return "; ".join(body) if body else "invalid input"

    def _compose(self) -> str:
        if getattr(self, "worker_text", None) is not None:  # it already says where, what, the tags
            return self.worker_text
        loc = self.location()
        msg = (f"{loc}: " if loc else "") + self.message_body()
        if self.fix:
            msg += f" - {self.fix}"
        tags = [f"stage: {self.stage}"]
        if self.column is not None and not (self.column_in_location and self.where is None):
            tags.append(f"column: {self.column!r}")
        return msg + " [" + ", ".join(tags) + "]"

    def __str__(self) -> str:  # composed on demand: encode fills in row/column after the fact
        return self._compose()

    def locate(self, *, row=None, column=None, image=None) -> "InputError":
        """Fill in location attributes the raiser did not know (returns self)."""
        if self.row is None and row is not None:
            self.row = row
            if self.where is not None and self.where.startswith("row (index unknown"):
                self.where = None
        if self.column is None:
            self.column = column
        if self.image is None:
            self.image = image
        self.args = (self._compose(),)
        return self

    def restage(self, stage: str) -> "InputError":
        """Report the error at ``stage`` instead (a stage re-raising what a check it runs found,
        e.g. collate running `MultiModalInputs.validate`); returns self."""
        self.stage = stage
        self.args = (self._compose(),)
        return self

    def record(self) -> dict:
        """``{"row", "stage", "column", "reason"}``: what ``on_error="skip"`` stores."""
        return {"row": self.row, "stage": self.stage, "column": self.column, "reason": str(self)}

    def __reduce__(self):
        """Every attribute (``__notes__`` and any set after raising included), as `MMPipeError`;
        a subclass whose own ``__reduce__`` builds on this one gets ``(_rebuild, (cls, detail,
        kwargs))``, the form it unpacks."""
        if type(self).__reduce__ is InputError.__reduce__:
            return super().__reduce__()
        return (_rebuild, (type(self), self.detail, dict(
            row=self.row, column=self.column, stage=self.stage, expected=self.expected,
            found=self.found, fix=self.fix, image=self.image, where=self.where,
            column_in_location=self.column_in_location)))


_SPLITS = (" - ", "; ", "expected ", "found ", "invalid input")  # what `fields_from_message` splits at


def _rebuild(cls, detail, kwargs):
    return cls(detail, **kwargs)


class ParseError(InputError):
    """The raw row has the wrong shape: no messages, empty list, non-string text."""

    default_stage = "parse"


class PlaceholderError(InputError):
    """Image placeholders and images disagree (count, or image tokens vs images)."""

    default_stage = "template"


class ImageError(InputError):
    """An image cannot be used: unreadable bytes, missing path, 0 pixels, extreme aspect
    ratio, unsupported mode or dtype."""

    default_stage = "image"


class VideoError(ImageError):
    """A video cannot be used: corrupt or unknown container, no video stream, zero frames,
    a codec the decoder lacks, frames too large, or sampling options the video cannot meet.
    An `ImageError` (stage ``"image"``), so handlers of image failures see videos too."""


class AudioError(InputError):
    """An audio clip cannot be used: unreadable or truncated file, no audio stream, zero samples,
    no or another sampling rate than the processor's, non-finite samples, or longer than the
    processor's feature extractor takes (it would cut the clip)."""

    default_stage = "audio"


class TruncationError(InputError):
    """The row exceeds ``max_length`` and the truncation policy cannot handle it."""

    default_stage = "truncate"


class PixelDataError(InputError):
    """Pixel data do not match their grids, hold NaN/inf, or have the wrong dtype/shape."""

    default_stage = "collate"


class FamilyMismatchError(InputError):
    """Rows were encoded for another model family than the processor/collator at hand."""

    default_stage = "collate"


# What the public stages (encode, Collator, records validation) raise for bad input.
# Anything else escaping them is a bug in mmpipe - the fuzz tests hold us to that.
DOCUMENTED_ERRORS = (
    InputError, ParseError, PlaceholderError, ImageError, VideoError, AudioError, TruncationError, PixelDataError,
    FamilyMismatchError,
)

__all__ = [
    "STAGES", "MMPipeError", "ArgumentError", "InputError", "ParseError", "PlaceholderError", "ImageError",
    "VideoError", "AudioError", "TruncationError", "PixelDataError", "FamilyMismatchError", "DOCUMENTED_ERRORS",
]


class NotAFamilyError(ArgumentError, TypeError):
    """`mmpipe.families.family_of` of what names no family (None, a number, a list): pass a
    processor, tokenizer, model, config or family name. A `TypeError` too, as it was before."""


class UnsupportedProcessorError(ArgumentError):
    """A vision-language processor (or model config) of a family mmpipe has no table row for.

    The message names the class and the path such a processor takes (`GENERIC_PATH`: the
    processor's own chat template and call, 1-D positions). ``class_name`` holds the class (also
    after a DataLoader worker's re-raise: `MMPipeError.keep_fields`).
    """

    def __init__(self, message: str, class_name: Optional[str] = None):
        super().__init__(message)
        self.keep_fields(message, class_name=class_name)


class PackingUnsupportedError(ArgumentError):
    """Packing refused: with this model, rows put end to end in one sequence would not each get
    their own outputs - a layer type that carries state or attention across the rows' boundaries
    (``layer_type``, e.g. ``"linear_attention"``, at decoder layers ``layers``), or a family whose
    model is not known to take packed rows (``layer_type`` None, the family table's reason). The
    message names it and the alternative, padded batches (`mmpipe.Collator`). An `ArgumentError`,
    so ``except ArgumentError`` / ``except ValueError`` keep catching what packing refused before.
    """

    def __init__(self, message: str, *, layer_type: Optional[str] = None, layers: tuple = (),
                 model_type: Optional[str] = None):
        super().__init__(message)
        self.keep_fields(message, layer_type=layer_type, layers=tuple(layers), model_type=model_type)


# ---- what argument checks accept -------------------------------------------------------
def is_integer(value: Any) -> bool:
    """An integer type (``int``, a numpy integer), not a ``bool``: what checks of counts, ids
    and seeds accept before raising `ArgumentError`."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A finite real number (``int``, ``float``, numpy scalars), not a ``bool``: what checks of
    temperatures and probabilities accept."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
