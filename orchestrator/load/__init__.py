"""Load curves: SGLang's bench_serving at several load levels against one configuration's live server (docs/tune.md)."""
