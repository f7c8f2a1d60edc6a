"""mmpipe's benchmark suite (issue 6): ``python -m bench [--quick]``. See bench/README.md."""
