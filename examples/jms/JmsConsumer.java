// A JMS consumer of what an nsjms bridge sends: the ActiveMQ client (OpenWire) alone, no nsjms or CORBA code.
//
//   java -cp "$CP:." JmsConsumer URL queue|topic NAME COUNT TIMEOUT_S [CREDENTIALS_FILE]
//
// URL is the broker's OpenWire address (the embedded broker: tcp://127.0.0.1:61616); CREDENTIALS_FILE holds the
// login and passcode on two lines (the embedded broker's <state-dir>/activemq/credentials; it refuses anonymous
// connections). It prints "ready", then one line per message: the event's name and type from the $event_name,
// $domain_name and $type_name properties, JMSPriority, JMSDeliveryMode, JMSType and the text body, and
// acknowledges it (CLIENT_ACKNOWLEDGE). Exit code 0 after COUNT messages, 1 when TIMEOUT_S passes first.
// Build (Debian: apt-get install libactivemq-java):
//   CP=/usr/share/java/activemq-client.jar:/usr/share/java/geronimo-jms_1.1_spec.jar:/usr/share/java/slf4j-api.jar:\
//      /usr/share/java/hawtbuf.jar:/usr/share/java/geronimo-j2ee-management-1.1-spec.jar
//   javac -cp "$CP" -d . examples/jms/JmsConsumer.java

import java.nio.file.Files;
import java.nio.file.Path;
import javax.jms.Connection;
import javax.jms.DeliveryMode;
import javax.jms.Destination;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.Session;
import javax.jms.TextMessage;
import org.apache.activemq.ActiveMQConnectionFactory;

public final class JmsConsumer {
    private JmsConsumer() {}

    public static void main(String[] args) throws Exception {
        String url = args[0], kind = args[1], name = args[2];
        int count = Integer.parseInt(args[3]);
        long deadline = System.currentTimeMillis() + 1000L * Long.parseLong(args[4]);
        String login = null, passcode = null;
        if (args.length > 5) {
            String[] cred = Files.readString(Path.of(args[5])).split("\n");
            login = cred[0];
            passcode = cred[1];
        }
        Connection connection = new ActiveMQConnectionFactory(url).createConnection(login, passcode);
        try {
            Session session = connection.createSession(false, Session.CLIENT_ACKNOWLEDGE);
            Destination dest = "topic".equals(kind) ? session.createTopic(name) : session.createQueue(name);
            MessageConsumer consumer = session.createConsumer(dest);
            connection.start();
            System.out.println("ready");
            System.out.flush();
            for (int seen = 0; seen < count; seen++) {
                long left = deadline - System.currentTimeMillis();
                Message m = left > 0 ? consumer.receive(left) : null;
                if (m == null) {
                    System.exit(1);
                }
                String body = m instanceof TextMessage ? ((TextMessage) m).getText() : m.getClass().getSimpleName();
                System.out.println(m.getStringProperty("$event_name") + " " + m.getStringProperty("$domain_name") + "/"
                        + m.getStringProperty("$type_name") + " priority=" + m.getJMSPriority() + " persistent="
                        + (m.getJMSDeliveryMode() == DeliveryMode.PERSISTENT) + " type=" + m.getJMSType()
                        + " body=" + body);
                System.out.flush();
                m.acknowledge();
            }
        } finally {
            connection.close();
        }
    }
}
