"""`AGENTRT_LOG_FORMAT=json`: one object per line, the run's fields on every
record written inside its block (whatever logger), none outside it."""

import io
import json
import logging

from ops.logs import JsonFormatter, RunContextFilter, log_context, log_context_update


def capture():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RunContextFilter())
    logger = logging.getLogger("test.jsonlogs")
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_records_inside_a_run_block_carry_its_fields_and_exceptions_stay_on_one_line():
    logger, stream = capture()
    logger.info("before")
    with log_context(run="r-1", tenant="t-1", epoch=3, worker="host:12:abcd"):
        logger.info("claimed %s", "r-1")
        log_context_update(step=2)
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logger.exception("failed")
    logger.info("after")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    before, claimed, failed, after = (json.loads(line) for line in lines)
    assert "run" not in before and "run" not in after
    assert (
        claimed["run"] == "r-1"
        and claimed["tenant"] == "t-1"
        and claimed["epoch"] == 3
        and claimed["worker"] == "host:12:abcd"
    )
    assert claimed["message"] == "claimed r-1" and claimed["level"] == "INFO" and claimed["logger"] == "test.jsonlogs"
    assert "step" not in claimed and failed["step"] == 2
    assert failed["exc_type"] == "ValueError" and "second line" in failed["exc"]
