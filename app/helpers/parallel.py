"""``parallel(...)``: several tool calls at once; the caller's tools are all sent in one pause.

Runs in the sandbox (``app.runtime.child``); this module documents it for the prompt and
``helpers()``. The external calls of one ``parallel`` reach the caller together, as one list of
``pending_tool_calls`` (a Chat Completions client sees several ``tool_calls``), and the block goes
on with every value once the caller answers them all.
"""

from __future__ import annotations

from app.helpers.base import HelperSpec

SPEC = HelperSpec(
    name="parallel",
    signature="parallel(tool, items=None, *, return_exceptions=False) -> list",
    doc="""
Call tools at once instead of one after another. Tools that run in the caller's systems are
sent to the caller together and answered together, so independent lookups cost one wait
instead of one each. Returns the results as a list, in order.
  parallel(tool, items): one call per item; an item that is a dict gives the keyword arguments.
  parallel([(tool_a, {...}), (tool_b, {...})]): different tools, each with its keyword arguments.
Every call is made; if any raised, the first error (in order) is raised after them, unless
return_exceptions=True puts each error (a ToolError) in its place in the list. Use it only for
calls that do not depend on each other's results.
Example:
    user = get_user_details(user_id=user_id)
    orders = parallel(get_order_details, [{"order_id": o} for o in user["orders"]])
    for order in orders:
        print(order["order_id"], order["status"])
""",
    runs="sandbox",
)
