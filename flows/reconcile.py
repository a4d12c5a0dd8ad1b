"""What a stopped flow run leaves behind in Prefect.

A SIGKILL skips every clean-up, so the flow run and its stage task runs stay RUNNING for ever.
The next run on the same storage root learns of the killed one from the root's lock (which
records the holder's flow run id, rstar.storage.lock) and marks them Crashed, as Prefect marks
a flow run whose process it saw die.

A cancelled flow run ends Cancelled, but Prefect's task engine records the stage it stopped as
Crashed (the cancel reaches the task as a termination signal); the flows' cancellation hook
marks that task run Cancelled too.
"""

from __future__ import annotations

from contextlib import contextmanager
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    TaskRunFilter,
    TaskRunFilterFlowRunId,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed, State

from rstar.storage.lock import hold_root

UNFINISHED = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED]


def crash_killed_flow_run(flow_run_id: str, why: str) -> list[str]:
    """Mark the flow run `flow_run_id` and its unfinished task runs Crashed (`why` is the state's
    message); returns the names of what was marked. A run that finished, or that this API does
    not know (another Prefect server), is left alone."""
    marked = []
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(UUID(flow_run_id))
        except ObjectNotFound:
            return []
        if run.state is None or run.state.is_final():
            return []
        client.set_flow_run_state(run.id, Crashed(message=why), force=True)
        marked.append(f"flow run {run.name}")
        marked += _mark_task_runs(client, run.id, UNFINISHED, lambda: Crashed(message=why))
    return marked


def _mark_task_runs(client, flow_run_id: UUID, types: list[StateType], state) -> list[str]:
    """Set `state()` on the task runs of `flow_run_id` whose state is of `types`."""
    found = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=types)),
    )
    marked = []
    for task_run in client.read_task_runs(task_run_filter=found):
        client.set_task_run_state(task_run.id, state(), force=True)
        marked.append(f"task run {task_run.name}")
    return marked


def cancel_stage_tasks(flow, flow_run, state: State) -> None:
    """A flow's on_cancellation hook: the stage task the cancel stopped (Crashed by Prefect's
    task engine, or still RUNNING if its process died first) ends Cancelled with its flow run."""
    why = f"cancelled with flow run {flow_run.name}"
    with get_client(sync_client=True) as client:
        _mark_task_runs(
            client, flow_run.id, [*UNFINISHED, StateType.CRASHED], lambda: Cancelled(message=why)
        )


@contextmanager
def claim_root(root: str):
    """Hold the storage root `root` for this flow run (rstar.storage.lock: a second run fails at
    once naming this one); first, what a killed holder left RUNNING in Prefect is marked Crashed."""
    me = f"flow run {flow_run.get_name()} ({flow_run.get_id()})"
    with hold_root(root, me, flow_run_id=str(flow_run.get_id())) as killed:
        if killed and killed.get("flow_run_id"):
            why = (
                f"its process (pid {killed.get('pid')} on {killed.get('host')}) was killed holding "
                f"{root}; marked by {me}"
            )
            marked = crash_killed_flow_run(killed["flow_run_id"], why)
            if marked:
                get_run_logger().warning(
                    "marked Crashed, left RUNNING by a killed run: %s", ", ".join(marked)
                )
        yield
