"""The one inline ``<style>`` block every HTML view of mmpipe starts with (`mmpipe.view.html`):
no JavaScript, no external resource."""

from __future__ import annotations

__all__ = ["style_block"]

CSS = """
.mmpipe{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:13px;color:#222;
  background:#fff;line-height:1.45;margin:6px 0;padding:6px 8px;border:1px solid #ddd;border-radius:6px}
.mmpipe .mmpipe{border:none;padding:0;margin:10px 0 0 0}
.mmpipe-head{font-weight:600;margin:2px 0 6px 0}
.mmpipe-note{color:#8a5a00;font-size:12px;margin:2px 0}
.mmpipe-images{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-end;margin:6px 0}
.mmpipe-figure{margin:0;display:flex;flex-direction:column;align-items:flex-start}
.mmpipe-figure img{border:4px solid;display:block}
.mmpipe-pixelated{image-rendering:pixelated}
.mmpipe-figure figcaption{font-size:11px;color:#444;max-width:340px;margin-top:2px}
.mmpipe-frames{display:flex;gap:3px;padding:3px;border:4px dashed}
.mmpipe-placeholder{border:3px dashed #888;box-sizing:border-box;display:flex;align-items:center;
  justify-content:center;text-align:center;font-size:11px;color:#444;padding:4px;
  background:repeating-linear-gradient(45deg,#f3f3f3,#f3f3f3 6px,#e6e6e6 6px,#e6e6e6 12px)}
.mmpipe-strip{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;line-height:2.2;
  word-break:break-all;margin:6px 0}
.mmpipe-tok{white-space:pre;background:#eef0f3;border-radius:3px;padding:1px 2px;margin:0 1px}
.mmpipe-special{background:#e6e0f8;color:#4b2f99}
.mmpipe-trained{background:#dcf3e2;box-shadow:inset 0 -3px 0 #1f8a3b}
.mmpipe-image-span,.mmpipe-video-span{border:2px solid;border-radius:4px;padding:1px 6px;margin:0 2px;
  font-weight:600;white-space:nowrap;font-family:system-ui,sans-serif;font-size:11px}
.mmpipe-video-span{border-style:dashed}
.mmpipe-gap{color:#777;font-style:italic;padding:0 4px;white-space:nowrap}
.mmpipe-legend{font-size:11px;color:#555;margin:4px 0}
.mmpipe-legend span{margin-right:10px}
.mmpipe-table{border-collapse:collapse;margin:6px 0;font-size:12px}
.mmpipe-table th,.mmpipe-table td{border:1px solid #ccc;padding:2px 7px;text-align:left;vertical-align:top}
.mmpipe-table th{background:#f4f4f4}
.mmpipe-response{white-space:pre-wrap;background:#f7f7f7;border-left:3px solid #1f8a3b;padding:4px 8px;
  font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
"""


def style_block() -> str:
    """``<style>...</style>`` with the classes the views use (``mmpipe-strip``, ``mmpipe-tok`` ...)."""
    return f"<style>{CSS}</style>"
