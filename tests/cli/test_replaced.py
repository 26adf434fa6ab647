"""The reference client's spellings that gmp replaced name the replacement (exit 2)."""

from __future__ import annotations

import pytest
from genmanip.cli.main import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["eval", "--web_view"], "gmp viz"),
        (["eval", "--web_view_port", "9000"], "gmp viz"),
        (["visualize", "--flush-cache"], "gmp clean"),
        (["viz", "--flush_cache"], "gmp clean"),
        (["analyse"], "gmp compare"),
        (["analyze", "--run", "x"], "gmp report"),
    ],
)
def test_a_replaced_spelling_names_what_to_use(argv: list[str], says: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
