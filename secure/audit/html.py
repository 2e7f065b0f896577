"""The report's HTML pieces: the style sheet, the Content-Security-Policy, and escaped tables,
facts, figures and empty notes (every figure with a table holding the same numbers)."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;line-height:1.4}
h1{font-size:1.6em}h2,h3{border-bottom:1px solid #767676;padding-bottom:.2em;margin-top:1.6em}
article{border-top:4px solid #0072B2;margin-top:2.5em}
table{border-collapse:collapse;font-size:.85em;margin:.4em 0}td,th{border:1px solid #767676;padding:3px 8px;
text-align:left;vertical-align:top}caption{text-align:left;font-weight:600;padding:.2em 0}
th[scope=row]{background:#f2f2f2}
.ok{background:#e6f4ea;border-left:6px solid #1b7a6e;padding:.6em}.bad{background:#fdecea;border-left:6px solid #c0392b;padding:.6em}
.warn{background:#fff4e0;border-left:6px solid #8a5a00;padding:.6em}
.empty{color:#555;font-style:italic}code{font-size:.85em;word-break:break-all}img{max-width:100%}"""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
FINGERPRINT = ("The fingerprint of a key is the SHA-256 of its 32 raw Ed25519 public-key bytes, in hex "
               "(the short form is its first 16 digits).")
#: What each metric name the SDK releases means ("val_" = measured on the validation split).
METRIC_DEFINITIONS = {
    "auroc": "area under the ROC curve: 0.5 is chance, 1 is perfect ranking (higher is better)",
    "auprc": "area under the precision-recall curve, average precision (higher is better)",
    "brier": "Brier score: mean squared error of the predicted probabilities (lower is better)",
    "ece": "expected calibration error: mean gap between predicted and observed risk, by bins (lower is better)",
    "loss": "log loss (binary cross-entropy) of the predicted probabilities (lower is better)",
    "n": "number of patients evaluated",
    "positives": "number of positive patients evaluated",
    "f1": "F1 score: harmonic mean of precision and recall at the decision threshold (higher is better)",
    "micro_f1": "micro-averaged F1 over all labels (higher is better)",
}


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _img(ident: str, png_b64: str, alt: str) -> str:
    return (f'<img id="{ident}" alt="{escape(alt)}" src="data:image/png;base64,{png_b64}" '
            f'aria-describedby="{ident}-data">')


def _empty(ident: str, what: str) -> str:
    return f'<p class="empty" id="{ident}-empty">{escape(what)}</p>'


def _table(header: list[str], rows: list[list[Any]], *, caption: str = "", ident: str = "",
           row_headers: bool = True) -> str:
    """A data table: a caption, column headers (scope=col), the first cell of a row as its header
    (unless ``row_headers`` is False: rows such as edges have no single naming cell)."""
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    head = "".join(f'<th scope="col">{escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(
        (f'<th scope="row">{escape(str(c))}</th>' if i == 0 and row_headers else f"<td>{escape(str(c))}</td>")
        for i, c in enumerate(r)) + "</tr>" for r in rows)
    idattr = f' id="{ident}"' if ident else ""
    return f"<table{idattr}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts(rows: list[tuple[str, Any]], *, caption: str) -> str:
    """A two-column table of named facts: each name is its row's header (no empty header row)."""
    body = "".join(f'<tr><th scope="row">{escape(k)}</th><td>{escape(str(v))}</td></tr>' for k, v in rows)
    return f"<table><caption>{escape(caption)}</caption><tbody>{body}</tbody></table>"


def describe_metric(name: str) -> str:
    """What a released metric name means (``val_`` = on the validation split)."""
    base = name.removeprefix("val_")
    meaning = METRIC_DEFINITIONS.get(base, "a metric the hospitals' release settings name; Clinograph does not "
                                           "define it")
    return meaning + (", on the validation split" if name.startswith("val_") else "")
