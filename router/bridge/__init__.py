"""The NS⇄JMS bridge (OMG Notification/JMS Interworking): CosBridgeAdmin factory and bridges."""
