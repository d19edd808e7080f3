-- The checkpoint ledger's own database and role (Airflow's metadata uses "airflow").
CREATE ROLE eo LOGIN PASSWORD 'eo';
CREATE DATABASE eo OWNER eo;
