"""What `mmpipe.data.validate.validate_dataset` returns: `ValidationReport` (one `Issue` per
problem: severity, column, rows, message, fix) and `SchemaError`, raised with the whole report.
The same for every family (the media strategies' ``dataset_checks`` return `Issue` too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mmpipe.errors import InputError

__all__ = ["SchemaError", "Issue", "ValidationReport", "REENCODE"]

REENCODE = "re-encode the raw rows with mmpipe.encode (this mmpipe version)"


class SchemaError(InputError):
    """An encoded dataset does not match the stored-row schema (see `ValidationReport`)."""

    default_stage = "validate"


@dataclass
class Issue:
    """One problem: ``severity`` "error" (training on it would fail or be wrong), "warning"
    (works, but differs from the schema) or "fixed" (repaired by ``fix=True``)."""

    severity: str
    kind: str  # missing_column, extra_column, type, shape, content, family, failed_rows
    column: Optional[str]
    message: str
    fix: str = ""
    rows: list = field(default_factory=list)  # row indexes (the first `max_rows_listed`)
    num_rows: int = 0  # rows affected (0: the whole column)

    def __str__(self) -> str:
        where = f"column {self.column!r}" if self.column else "dataset"
        if self.rows:
            more = f" (+{self.num_rows - len(self.rows)} more)" if self.num_rows > len(self.rows) else ""
            where += f", rows {self.rows}{more}"
        return f"[{self.severity}] {where}: {self.message}" + (f" - fix: {self.fix}" if self.fix else "")


@dataclass
class ValidationReport:
    """What `validate_dataset` found. ``ok`` when no issue is an error; ``data`` is the
    repaired table / dataset when ``fix=True`` (else the input as loaded)."""

    num_rows: int
    pixel_format: str
    labels: bool
    issues: list = field(default_factory=list)
    data: Any = None

    @property
    def errors(self) -> list:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def fixed(self) -> list:
        return [i for i in self.issues if i.severity == "fixed"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def __str__(self) -> str:
        head = (f"mmpipe encoded dataset: {self.num_rows} rows, pixels={self.pixel_format}, "
                f"labels={'yes' if self.labels else 'no'}: "
                + ("OK" if self.ok else f"{len(self.errors)} error(s)")
                + (f", {len(self.warnings)} warning(s)" if self.warnings else "")
                + (f", {len(self.fixed)} fixed" if self.fixed else ""))
        return "\n".join([head] + [f"  {i}" for i in self.issues])

    def raise_if_errors(self) -> "ValidationReport":
        if self.errors:
            first = self.errors[0]
            raise SchemaError(str(self), where="", column=first.column, row=(first.rows or [None])[0],
                              expected="no errors",
                              found=f"{len(self.errors)} error(s), the first of kind {first.kind!r}",
                              fix="see the report lines; validate_dataset(..., fix=True) applies the safe repairs")
        return self
