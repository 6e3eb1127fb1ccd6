"""Run the CLI in-process and insist a bad input is one error line with exit status 2."""

import pytest


def cli_error(argv, capsys) -> str:
    from postplace.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["postplace", *argv])
        with pytest.raises(SystemExit) as ex:
            main()
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]
