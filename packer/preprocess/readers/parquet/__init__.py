"""Parquet (.parquet): pyarrow reads the row groups, and packer's own page reader takes the column chunks pyarrow
would hold too many copies of.

    reader.py         the reader (READERS' ".parquet"): units are runs of row groups; a unit's text column
                      (`texts`) or record columns (`records`) are read by pyarrow, a batch of rows at a time
    pages.py          packer's page reader: one column chunk, page by page, values taken where they lie
    page_levels.py      a list column's rows (a chat's messages) put together from its leaves' levels
    page_headers.py     Thrift page headers;  page_streams.py, snappy_pieces.py: a huge page decompressed in pieces

Which runs: pyarrow, for every row group, unless one of the unit's chunks it would read has a page over
HUGE_TEXT_BYTES (a value that may be huge: pyarrow's copies of it would take 4-5x its size) and is of a
layout pages.py reads (BYTE_ARRAY, flat or a three-level list of strings or of structs of strings, PLAIN or
dictionary-encoded, a codec pyarrow.decompress knows, headers that agree with the footer). That row group
alone goes to the page reader; everything else of the unit, and every chunk it cannot read (it says so
before a byte of it is read), stays with pyarrow. Both give the same documents, records and skips
(tests/preprocess/test_parquet_pages.py, test_page_levels.py).
"""

from packer.preprocess.readers.parquet.reader import COMPRESSIBLE, NAME, field_names, plan, records, texts

__all__ = ["COMPRESSIBLE", "NAME", "field_names", "plan", "records", "texts"]
