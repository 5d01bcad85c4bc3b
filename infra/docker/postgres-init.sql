-- The Prefect database is created by POSTGRES_DB; MLflow gets its own.
CREATE DATABASE mlflow;
