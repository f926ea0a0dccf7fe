"""Entry points: the `gem` CLI, torchrun, spark-submit and `python -m` scripts. Nothing imports them."""
