"""The engine: requests in, one step at a time, outputs out.

The loop (`llm_engine`), its asyncio front (`async_engine`) and offline API (`llm`), the scheduler
with its block manager and sequences, each request's stop rules and text, and the server <->
engine contract (`protocol`). Scheduler, block manager and sequence import no torch. It drives the
executor and builds its parts once from loading (`build`).
"""
