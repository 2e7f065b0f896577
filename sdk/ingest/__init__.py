"""Ingestion of hospital tables (wide or long) into validated PatientTables."""

from .read import read_site_table
from .table import IngestReport, PatientTable
from .validate import ingest, read_table

__all__ = ["IngestReport", "PatientTable", "ingest", "read_site_table", "read_table"]
