"""PySpark jobs for bulk enrolment."""
