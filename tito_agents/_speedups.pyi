def parse_ids(data: bytes | bytearray | memoryview, /) -> bytearray | None:
    """Native int32 ids of the inner text of a JSON id list, or None when it is not one."""
