def parse_ids(data: bytes | bytearray | memoryview, /) -> bytearray | None:
    """Native int32 ids of the inner text of a JSON id list, or None when it is not one."""

def chat_logprobs(data: bytes | bytearray | memoryview, /) -> bytearray | None:
    """Native float32 logprobs of the inner text of a chat `logprobs.content` array, or None
    when only the full parse can say what it holds."""
