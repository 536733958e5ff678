"""`python -m workers.sglang.bench_serving ARGS`: SGLang's own load generator, unchanged (`sglang.benchmark.serving`'s
`cli_main`, what `python -m sglang.bench_serving` runs), with the one import it cannot make on a venv without
torchvision stubbed first (`workers.sglang.argcheck.prepare_sglang_imports`: SGLang's multimodal configs import it at
module level; bench_serving never uses it)."""

from __future__ import annotations


def main() -> None:
    from workers.sglang.argcheck import prepare_sglang_imports

    prepare_sglang_imports(None)
    from sglang.benchmark.serving import cli_main

    cli_main()


if __name__ == "__main__":
    main()
