"""`rlhfkit view RUN_DIR [--file samples.jsonl]`: write RUN_DIR/samples.html.

The page shows the completions the trainer logged at each step (prompt, response, label,
reward, advantage, length; --logger.log_samples per step) and filters them by step range,
reward range and text. It is one static file with inline CSS/JS and no network requests: open
it from disk in any browser. Filters can be set in the URL too: samples.html#step=3-5&rmin=1
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.errors import ConfigError, DataError, one_line, os_error_fix
from rlhfkit.tracking.samples import SAMPLES_FILE
from rlhfkit.tracking.viewer import write_viewer


def run(argv: list[str]) -> int:
    samples = SAMPLES_FILE
    if "--file" in argv:
        i = argv.index("--file")
        if i + 1 >= len(argv):
            raise ConfigError("--file: give the jsonl file name inside RUN_DIR (default samples.jsonl)")
        samples = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if len(argv) != 1:
        raise ConfigError("usage: rlhfkit view RUN_DIR [--file samples.jsonl]")
    run_dir = Path(argv[0])
    if not (run_dir / samples).is_file():
        raise ConfigError(f"{run_dir / samples} does not exist: give a run folder "
                          f"(--ckpt.output_dir of `rlhfkit train rl`) that holds {samples}")
    try:
        out = write_viewer(run_dir, samples, Path(samples).stem + ".html")
    except OSError as exc:  # e.g. a run folder on a read-only mount
        raise ConfigError(f"cannot write the viewer page into {run_dir}: {one_line(exc)}; {os_error_fix(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{run_dir / samples}: bytes that are not UTF-8 ({exc.reason} at byte {exc.start}); "
                        "re-encode the file as UTF-8") from exc
    except ValueError as exc:  # a line that is not JSON (the torn last line of a killed run is skipped)
        raise DataError(f"{' '.join(str(exc).split())}; fix or delete that line") from exc
    print(f"wrote {out} (open it in a browser; nothing is loaded from the network)")
    return 0
