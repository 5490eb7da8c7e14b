"""The asyncio API: AsyncClient wraps a Client. Prefetched IDs come
straight from the buffer without leaving the event loop; every call that
goes to a node (and a next_id that has to wait for a refill) runs in the
loop's default executor, so the loop never blocks on the network."""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any, Dict, List, Mapping, Optional

from ._client import Client


class AsyncClient:
    """Client's API as coroutines; arguments as for Client (use
    AsyncClient.from_env() for Consul's variables)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client = kwargs.pop("client", None) or Client(*args, **kwargs)

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> "AsyncClient":
        """Builds the client (Consul's first answer) off the event loop."""
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(None, functools.partial(Client, *args, **kwargs))
        return cls(client=client)

    @classmethod
    async def from_env(cls, **kwargs: Any) -> "AsyncClient":
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(None, functools.partial(Client.from_env, **kwargs))
        return cls(client=client)

    @property
    def sync(self) -> Client:
        """The underlying synchronous client."""
        return self._client

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))

    async def next_id(self, mode: str = "snowflake", tag: str = "") -> int:
        """The next prefetched ID; waits (off the loop) only when the buffer is empty."""
        if str(mode).lower() != "strict":
            p = self._client.prefetcher(mode, tag)
            if p.depth():
                try:
                    return p._pop_now()
                except IndexError:
                    pass
            return await self._run(p.next_id)
        return await self.gen_id("strict", tag)

    async def gen_id(self, mode: str = "snowflake", tag: str = "") -> int:
        return await self._run(self._client.gen_id, mode, tag)

    async def gen_ids(self, count: int, mode: str = "snowflake", tag: str = "") -> List[int]:
        return await self._run(self._client.gen_ids, count, mode, tag)

    async def gen_formatted(self, format: str, params: Optional[Mapping[str, str]] = None,
                            count: int = 1) -> List[str]:
        return await self._run(self._client.gen_formatted, format, params, count)

    async def parse_formatted(self, format: str, formatted_id: str) -> Dict[str, Any]:
        return await self._run(self._client.parse_formatted, format, formatted_id)

    async def format_counter(self, format: str,
                             params: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        return await self._run(self._client.format_counter, format, params)

    async def decode_id(self, id: int, mode: str = "snowflake", tag: str = "") -> Dict[str, Any]:
        return await self._run(self._client.decode_id, id, mode, tag)

    async def reveal(self, tag: str, id: int) -> Dict[str, Any]:
        return await self._run(self._client.reveal, tag, id)

    async def next_uuid(self) -> uuid.UUID:
        """The next prefetched UUIDv7; waits (off the loop) only when the buffer is empty."""
        p = self._client._prefetchers.get(("uuid", ""))
        if p is not None and p.depth():
            try:
                return p._pop_now()
            except IndexError:
                pass
        return await self._run(self._client.next_uuid)

    async def gen_uuids(self, count: int) -> List[uuid.UUID]:
        return await self._run(self._client.gen_uuids, count)

    def nodes(self) -> List[str]:
        return self._client.nodes()

    def strict_node(self, key: str) -> Optional[str]:
        return self._client.strict_node(key)

    async def close(self) -> None:
        self._client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
