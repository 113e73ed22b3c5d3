def parse_ids(data: bytes | bytearray | memoryview, /) -> bytearray | None:
    """Native int32 ids of the inner text of a JSON id list, or None when it is not one."""

def chat_logprobs(
    data: bytes | bytearray | memoryview, start: int, /
) -> tuple[int, bytearray] | None:
    """Where the chat `logprobs.content` array whose entries begin at `start` closes, and the
    native float32 logprobs of its entries; None when only the full parse can say."""

def completion_logprobs(
    data: bytes | bytearray | memoryview, start: int, /
) -> tuple[int, bytearray] | None:
    """Where the completions `logprobs` object whose members begin at `start` closes, and the
    native float32 values of its `token_logprobs`; None when only the full parse can say."""
