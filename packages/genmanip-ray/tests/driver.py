"""A ``gmp eval --launcher ray`` driver for the tests (the package's tests run without the ``gmp``
command): ``python driver.py CONFIG_JSON`` runs :func:`genmanip_eval.run_eval` and prints the
summary as one JSON line."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from genmanip_eval import EvalConfig, run_eval

if __name__ == "__main__":
    summary = run_eval(EvalConfig(**json.loads(sys.argv[1])))
    print(json.dumps(asdict(summary)))
