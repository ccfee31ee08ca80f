"""The dispatch table of the Kafka front and the ApiVersions answer built from it.

Every module that serves Kafka APIs exports ``APIS``; :func:`build_table` joins
them, refusing a key registered twice, and ApiVersions advertises exactly the
handlers in the table, so a client never picks an API we do not serve.

The version ranges follow Apache Kafka 2.0.0 (docs/KAFKA.md): its maximum
versions are what clients use to infer the broker release (kafka-python's
``infer_broker_version_from_api_versions`` keys 2.0 on Fetch v8), and a
release-consistent table makes librdkafka and kafka-python both pick
RecordBatch v2 (magic 2) for Produce and Fetch. 2.0 predates flexible versions
(KIP-482), so every request header is v1 and no body has tagged fields.
"""

from __future__ import annotations

from collections.abc import Iterable

from spoolmq.kafka import groups, sasl
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.wire import Reader, Writer

# The ApiVersions versions we serve; any other version gets the KIP-511 answer.
API_VERSIONS_MIN = 0
API_VERSIONS_MAX = 2


def api_versions_body(
    table: dict[int, ApiHandler], version: int, error: int = ErrorCode.NONE
) -> bytes:
    """The ApiVersions response body; v0's layout when ``version`` is unsupported.

    KIP-511: a client that sends a newer ApiVersions than we know gets
    UNSUPPORTED_VERSION in the v0 format (which every version's parser can
    read) together with our ranges, and retries with the highest we list.
    """
    w = Writer().int16(error)
    entries = sorted(table.values(), key=lambda h: h.api_key)
    w.int32(len(entries))
    for h in entries:
        w.int16(h.api_key).int16(h.min_version).int16(h.max_version)
    if error == ErrorCode.NONE and version >= 1:
        w.int32(0)  # throttle_time_ms
    return w.getvalue()


def build_table(apis: Iterable[ApiHandler]) -> dict[int, ApiHandler]:
    """Key the handlers by api_key; a key registered twice is a programming error."""
    table: dict[int, ApiHandler] = {}
    for handler in apis:
        if handler.api_key in table:
            raise ValueError(f"Kafka API {handler.api_key} registered twice")
        table[handler.api_key] = handler
    return table


class Dispatcher:
    """The handlers of one Kafka child, looked up by api key."""

    def __init__(self, apis: Iterable[ApiHandler]) -> None:
        self.table = build_table([*apis, self._api_versions_handler()])

    def _api_versions_handler(self) -> ApiHandler:
        async def handle(ctx: RequestContext, version: int, reader: Reader) -> bytes:
            # v3+ requests carry client software name/version (flexible); we
            # never reach here for them because v3 is outside our range.
            return api_versions_body(self.table, version)

        return ApiHandler(
            ApiKey.API_VERSIONS, API_VERSIONS_MIN, API_VERSIONS_MAX, handle, name="ApiVersions"
        )

    def get(self, api_key: int) -> ApiHandler | None:
        return self.table.get(api_key)

    def unsupported_api_versions(self) -> bytes:
        """The KIP-511 fallback body (v0 layout, UNSUPPORTED_VERSION, our ranges)."""
        return api_versions_body(self.table, 0, ErrorCode.UNSUPPORTED_VERSION)


def core_apis() -> list[ApiHandler]:
    """The core handlers (produce, fetch, metadata, …), imported late to keep this module light."""
    from spoolmq.kafka import handlers

    return list(handlers.APIS)


def default_dispatcher(extra: Iterable[ApiHandler] = ()) -> Dispatcher:
    """Every API this front serves: the core, the group coordinator and SASL."""
    return Dispatcher([*core_apis(), *groups.APIS, *sasl.APIS, *extra])
