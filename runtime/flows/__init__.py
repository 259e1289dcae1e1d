"""The runtime of :class:`~runtime.Dataflow` stages (runtime/dataflow.py compiles a flow to
them): values and codecs (``values``), references to user code (``refs``), operators
(``ops``, ``windowing``), the stage computation (``stage``) and its key extractor (``keys``).
"""

PLAN_PARAM = "flow.plan"                  # the computation param holding a stage's plan (JSON)
FLOW_CODE = "runtime.flows.stage:FlowStage"
FLOW_KEY = "runtime.flows.keys:key_of"    # the key extractor of a stage's raw inputs, built from its plan
