"""One module per pipeline stage; importing this package registers the functional forms."""
