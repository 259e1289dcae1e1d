"""The runtime of :class:`~runtime.Dataflow` stages: how a flow is cut into them
(``compile``), values and codecs (``values``), references to user code (``refs``), operators
(``ops``, ``steps``, ``windowing`` and ``due``, ``joins``, with what a window is in
``assigners``), the stage computation (``stage``) and its key extractor (``keys``).
"""

PLAN_PARAM = "flow.plan"                  # the computation param holding a stage's plan (JSON)
FLOW_CODE = "runtime.flows.stage:FlowStage"
SINK_FLOW_CODE = "runtime.flows.stage:SinkStage"  # a stage with its sink fused in
FLOW_CODES = (FLOW_CODE, SINK_FLOW_CODE)  # a flow's stages' code
FLOW_KEY = "runtime.flows.keys:key_of"    # the key extractor of a stage's raw inputs, built from its plan


class _Skip:
    """What a flow's key extractor returns for a record its reader does not want (a filter
    before the reader's key_by dropped it): the record is not sent to that reader. Routing
    (runtime/routing.py) re-exports it as ``runtime.routing.SKIP``."""

    def __repr__(self) -> str:
        return "SKIP"


SKIP = _Skip()
