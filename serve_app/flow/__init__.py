"""A read from upload to answer, written once: the pipeline (decode -> detect
-> crop -> classify -> recognise -> assemble) over stage callables, what an
upload is, documents and their pages (PDF, TIFF, the PDF worker process),
the answer's formats. No Ray."""
