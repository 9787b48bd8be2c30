"""Presentation shared by every view (headless, the cockpit's widgets, the Markdown audit):
plain data in, rich Text or plain strings out. No Textual import here."""
