"""Other programs answered by the service: OCRmyPDF's OCR engine plugin."""
