// An independent JMS 1.1 client for the bridge interop tests, built only on the JMS API and ActiveMQ's
// connection factory (Debian's activemq-client and geronimo-jms jars). It speaks OpenWire, not STOMP.
//
//   java JmsTool produce <openwire-url> <queue|topic> <name> <count> <kinds> [persistent|nonpersistent]
//                        [<first> <pause-ms> <stop-file>]
//       kinds: comma list of text,bytes,map,stream,object; message i has kind kinds[i % len], JMSPriority i % 10,
//       JMSType "t<i>", correlation id "c<i>", typed properties n(int)=i, big(long), ratio(double), flag(boolean),
//       label(String), small(short), tiny(byte), f(float), and a body that encodes i. With the optional three: i
//       counts from <first>, each send is followed by a pause of <pause-ms>, and the producer stops early once
//       <stop-file> exists (a traffic source for fault tests). Prints {"sent": <messages sent>} at the end.
//   java JmsTool consume <openwire-url> <queue|topic> <name> <count> <timeout-ms> [selector]
//       prints one JSON object per message received on stdout, then a line {"done": <received>}.
//   java JmsTool durable <openwire-url> <client-id> <topic> <subscription> <count> <timeout-ms>
//       like consume, through a durable topic subscription.
//   java JmsTool special <openwire-url> <queue|topic> <name> <what> [arg]
//       one persistent "poison" message: what = nul-property (String property note = "a<NUL>b", text body
//       "poison"), big-text (a text body of <arg> characters); both carry the String property label = "poison".
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Enumeration;
import java.util.List;
import javax.jms.*;
import org.apache.activemq.ActiveMQConnectionFactory;

public final class JmsTool {
    public static final class Payload implements Serializable {
        private static final long serialVersionUID = 1L;
        public final int n;
        public Payload(int n) { this.n = n; }
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "produce": produce(args); break;
            case "consume": consume(args, null, null); break;
            case "durable": consume(new String[] {"consume", args[1], "topic", args[3], args[5], args[6]}, args[2], args[4]); break;
            case "special": special(args); break;
            default: throw new IllegalArgumentException("unknown command " + args[0]);
        }
    }

    private static Destination dest(Session s, String kind, String name) throws JMSException {
        return kind.equals("topic") ? s.createTopic(name) : s.createQueue(name);
    }

    private static void produce(String[] a) throws Exception {
        ActiveMQConnectionFactory f = new ActiveMQConnectionFactory(a[1]);
        f.setTrustAllPackages(true);
        Connection c = f.createConnection();
        try {
            Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
            MessageProducer p = s.createProducer(dest(s, a[2], a[3]));
            int count = Integer.parseInt(a[4]);
            String[] kinds = a[5].split(",");
            boolean persistent = a.length < 7 || !a[6].equals("nonpersistent");
            int first = a.length > 7 ? Integer.parseInt(a[7]) : 0;
            long pauseMs = a.length > 8 ? Long.parseLong(a[8]) : 0;
            java.io.File stopFile = a.length > 9 ? new java.io.File(a[9]) : null;
            p.setDeliveryMode(persistent ? DeliveryMode.PERSISTENT : DeliveryMode.NON_PERSISTENT);
            int sent = 0;
            for (int i = first; i < first + count; i++) {
                if (stopFile != null && stopFile.exists()) break;
                Message m = body(s, kinds[i % kinds.length], i);
                m.setJMSType("t" + i);
                m.setJMSCorrelationID("c" + i);
                m.setIntProperty("n", i);
                m.setLongProperty("big", 10_000_000_000L + i);
                m.setDoubleProperty("ratio", i + 0.5);
                m.setBooleanProperty("flag", i % 2 == 0);
                m.setStringProperty("label", "item-" + i);
                m.setShortProperty("small", (short) (i % 1000));
                m.setByteProperty("tiny", (byte) (i % 100));
                m.setFloatProperty("f", 1.25f);
                p.send(m, p.getDeliveryMode(), i % 10, 0);
                sent++;
                if (pauseMs > 0) Thread.sleep(pauseMs);
            }
            System.out.println("{\"sent\": " + sent + "}");
            System.out.flush();
        } finally {
            c.close();
        }
    }

    private static void special(String[] a) throws Exception {
        ActiveMQConnectionFactory f = new ActiveMQConnectionFactory(a[1]);
        Connection c = f.createConnection();
        try {
            Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
            MessageProducer p = s.createProducer(dest(s, a[2], a[3]));
            p.setDeliveryMode(DeliveryMode.PERSISTENT);
            Message m;
            switch (a[4]) {
                case "nul-property":
                    m = s.createTextMessage("poison");
                    m.setStringProperty("note", "a\u0000b");
                    break;
                case "big-text": {
                    char[] text = new char[Integer.parseInt(a[5])];
                    java.util.Arrays.fill(text, 'x');
                    m = s.createTextMessage(new String(text));
                    break;
                }
                default: throw new IllegalArgumentException(a[4]);
            }
            m.setStringProperty("label", "poison");
            p.send(m);
        } finally {
            c.close();
        }
    }

    private static Message body(Session s, String kind, int i) throws JMSException {
        switch (kind) {
            case "text": return s.createTextMessage("text-" + i + " \u00e9\u4e2d");
            case "bytes": {
                BytesMessage m = s.createBytesMessage();
                m.writeBytes(new byte[] {(byte) i, 0, (byte) 0xff, 42});
                return m;
            }
            case "map": {
                MapMessage m = s.createMapMessage();
                m.setInt("count", i);
                m.setString("name", "link-down");
                m.setDouble("load", 0.5);
                m.setBoolean("up", false);
                m.setLong("when", 1_700_000_000_000L);
                return m;
            }
            case "stream": {
                StreamMessage m = s.createStreamMessage();
                m.writeInt(i);
                m.writeString("s" + i);
                m.writeDouble(2.5);
                return m;
            }
            case "object": return s.createObjectMessage(new Payload(i));
            default: throw new IllegalArgumentException(kind);
        }
    }

    private static void consume(String[] a, String clientId, String subscription) throws Exception {
        ActiveMQConnectionFactory f = new ActiveMQConnectionFactory(a[1]);
        f.setTrustAllPackages(true);
        Connection c = f.createConnection();
        if (clientId != null) c.setClientID(clientId);
        int received = 0;
        try {
            Session s = c.createSession(false, Session.CLIENT_ACKNOWLEDGE);
            String selector = a.length > 6 ? a[6] : null;
            MessageConsumer mc = subscription != null
                    ? s.createDurableSubscriber((Topic) dest(s, "topic", a[3]), subscription)
                    : s.createConsumer(dest(s, a[2], a[3]), selector);
            c.start();
            int count = Integer.parseInt(a[4]);
            long deadline = System.currentTimeMillis() + Long.parseLong(a[5]);
            while (received < count) {
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) break;
                Message m = mc.receive(left);
                if (m == null) break;
                System.out.println(json(m));
                System.out.flush();
                m.acknowledge();
                received++;
            }
        } finally {
            c.close();
        }
        System.out.println("{\"done\": " + received + "}");
    }

    private static String json(Message m) throws JMSException {
        StringBuilder b = new StringBuilder("{");
        field(b, "class", m.getClass().getSimpleName());
        field(b, "JMSPriority", m.getJMSPriority());
        field(b, "JMSDeliveryMode", m.getJMSDeliveryMode());
        field(b, "JMSExpiration", m.getJMSExpiration());
        field(b, "JMSTimestamp", m.getJMSTimestamp());
        field(b, "JMSType", m.getJMSType());
        field(b, "JMSCorrelationID", m.getJMSCorrelationID());
        field(b, "JMSMessageID", m.getJMSMessageID());
        field(b, "JMSRedelivered", m.getJMSRedelivered());
        b.append("\"properties\": {");
        Enumeration<?> names = m.getPropertyNames();
        boolean first = true;
        while (names.hasMoreElements()) {
            String name = (String) names.nextElement();
            Object v = m.getObjectProperty(name);
            if (!first) b.append(", ");
            first = false;
            b.append(quote(name)).append(": {\"type\": ").append(quote(v == null ? "null" : v.getClass().getSimpleName()))
             .append(", \"value\": ").append(quote(String.valueOf(v))).append("}");
        }
        b.append("}, \"body\": ").append(body(m)).append("}");
        return b.toString();
    }

    private static String body(Message m) throws JMSException {
        if (m instanceof TextMessage) return quote(((TextMessage) m).getText());
        if (m instanceof BytesMessage) {
            BytesMessage bm = (BytesMessage) m;
            byte[] data = new byte[(int) bm.getBodyLength()];
            bm.readBytes(data);
            return quote(Base64.getEncoder().encodeToString(data));
        }
        if (m instanceof MapMessage) {
            MapMessage mm = (MapMessage) m;
            StringBuilder b = new StringBuilder("{");
            Enumeration<?> names = mm.getMapNames();
            boolean first = true;
            while (names.hasMoreElements()) {
                String name = (String) names.nextElement();
                Object v = mm.getObject(name);
                if (!first) b.append(", ");
                first = false;
                b.append(quote(name)).append(": {\"type\": ").append(quote(v.getClass().getSimpleName()))
                 .append(", \"value\": ").append(quote(String.valueOf(v))).append("}");
            }
            return b.append("}").toString();
        }
        if (m instanceof StreamMessage) {
            StreamMessage sm = (StreamMessage) m;
            List<String> items = new ArrayList<>();
            try {
                while (true) {
                    Object v = sm.readObject();
                    items.add("{\"type\": " + quote(v == null ? "null" : v.getClass().getSimpleName()) + ", \"value\": "
                              + quote(String.valueOf(v)) + "}");
                }
            } catch (MessageEOFException end) {
                // all read
            }
            return "[" + String.join(", ", items) + "]";
        }
        if (m instanceof ObjectMessage) {
            Object o = ((ObjectMessage) m).getObject();
            return quote(o instanceof Payload ? "Payload:" + ((Payload) o).n : String.valueOf(o));
        }
        return "null";
    }

    private static void field(StringBuilder b, String k, Object v) {
        b.append(quote(k)).append(": ").append(v instanceof Number || v instanceof Boolean ? String.valueOf(v) : quote(v == null ? null : String.valueOf(v))).append(", ");
    }

    private static String quote(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    // JSON escapes for controls and for everything outside ASCII: the output stays exact whatever
                    // the JVM's stdout encoding (a C locale would print '?' for a Euro sign)
                    if (ch < 0x20 || ch >= 0x7f) b.append(String.format("\\u%04x", (int) ch)); else b.append(ch);
            }
        }
        return b.append("\"").toString();
    }
}
