// Shared by Supplier.java and Consumer.java: command line, ORB start, factory resolution, event formatting.
// Standard OMG IDL-to-Java mapping only (org.omg.*): any Java ORB that ships the COS Notification stubs works;
// the build line in docs/clients.md uses JacORB 3.9 (its jacorb-omgapi jar holds org.omg.CosNotify*).
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Properties;

import org.omg.CORBA.Any;
import org.omg.CORBA.IntHolder;
import org.omg.CORBA.ORB;
import org.omg.CORBA.TCKind;
import org.omg.CosNotification.EventHeader;
import org.omg.CosNotification.EventType;
import org.omg.CosNotification.FixedEventHeader;
import org.omg.CosNotification.Priority;
import org.omg.CosNotification.Property;
import org.omg.CosNotification.StructuredEvent;
import org.omg.CosNotifyChannelAdmin.ChannelNotFound;
import org.omg.CosNotifyChannelAdmin.EventChannel;
import org.omg.CosNotifyChannelAdmin.EventChannelFactory;
import org.omg.CosNotifyChannelAdmin.EventChannelFactoryHelper;

final class Example {
    static final String DEFAULT_FACTORY = "corbaloc::127.0.0.1:2809/NotifyEventChannelFactory";

    String factory = DEFAULT_FACTORY;  // --factory: corbaloc URL or IOR
    String factoryFile;                // --factory-file: file holding an IOR
    int channel = -1;                  // --channel: -1 creates a new channel
    int count = 10;                    // --count
    double timeout = 60.0;             // --timeout (consumer)
    String text = "hello";             // --text (supplier)

    /** Our options; -ORB... options and their values are left to the ORB. */
    static Example parse(String[] args) {
        Example o = new Example();
        for (int i = 0; i < args.length; i += 2) {
            if (i + 1 >= args.length) throw new IllegalArgumentException(args[i] + " needs a value");
            String name = args[i], value = args[i + 1];
            switch (name) {
                case "--factory": o.factory = value; break;
                case "--factory-file": o.factoryFile = value; break;
                case "--channel": o.channel = Integer.parseInt(value); break;
                case "--count": o.count = Integer.parseInt(value); break;
                case "--timeout": o.timeout = Double.parseDouble(value); break;
                case "--text": o.text = value; break;
                default:
                    if (!name.startsWith("-ORB")) throw new IllegalArgumentException("unknown option " + name);
            }
        }
        return o;
    }

    /** JacORB with a bounded wait for every call and, for a process that serves objects, a loopback endpoint. */
    static ORB initOrb(String[] args) {
        Properties props = new Properties();
        props.setProperty("org.omg.CORBA.ORBClass", "org.jacorb.orb.ORB");
        props.setProperty("org.omg.CORBA.ORBSingletonClass", "org.jacorb.orb.ORBSingleton");
        props.setProperty("jacorb.connection.client.pending_reply_timeout", "30000");
        if (System.getProperty("OAIAddr") == null) props.setProperty("OAIAddr", "127.0.0.1");
        return ORB.init(args, props);
    }

    EventChannelFactory resolveFactory(ORB orb) throws java.io.IOException {
        String ref = factoryFile != null ? new String(Files.readAllBytes(Paths.get(factoryFile))).trim() : factory;
        EventChannelFactory f = EventChannelFactoryHelper.narrow(orb.string_to_object(ref));
        if (f == null) throw new IllegalArgumentException(ref + " is not a CosNotifyChannelAdmin::EventChannelFactory");
        return f;
    }

    /** The channel named by --channel, or a new one with default QoS and admin properties; its id goes in id. */
    EventChannel openChannel(EventChannelFactory f, IntHolder id) throws ChannelNotFound, org.omg.CORBA.UserException {
        if (channel >= 0) {
            id.value = channel;
            return f.get_event_channel(channel);
        }
        return f.create_channel(new Property[0], new Property[0], id);
    }

    /** Event seq: fixed header, one variable header field, two filterable fields, a string body. */
    static StructuredEvent makeEvent(ORB orb, int seq, String text) {
        Any priority = orb.create_any();
        priority.insert_short((short) 0);
        Any seqValue = orb.create_any();
        seqValue.insert_long(seq);
        Any textValue = orb.create_any();
        textValue.insert_string(text);
        Any body = orb.create_any();
        body.insert_string(text + " #" + seq);
        FixedEventHeader fixed = new FixedEventHeader(new EventType("nsjms.example", "ExampleEvent"), "example-" + seq);
        EventHeader header = new EventHeader(fixed, new Property[] {new Property(Priority.value, priority)});
        return new StructuredEvent(header,
                new Property[] {new Property("seq", seqValue), new Property("text", textValue)}, body);
    }

    /** One line per event; supplier and consumer print the same line for the same event. */
    static String describe(StructuredEvent ev) {
        String seq = "None", text = "None", body = "";
        for (Property p : ev.filterable_data) {
            TCKind kind = p.value.type().kind();
            if (p.name.equals("seq") && kind == TCKind.tk_long) seq = Integer.toString(p.value.extract_long());
            else if (p.name.equals("text") && kind == TCKind.tk_string) text = p.value.extract_string();
        }
        if (ev.remainder_of_body.type().kind() == TCKind.tk_string) body = ev.remainder_of_body.extract_string();
        FixedEventHeader fixed = ev.header.fixed_header;
        return fixed.event_name + " " + fixed.event_type.domain_name + "/" + fixed.event_type.type_name
                + " seq=" + seq + " text=" + text + " body=" + body;
    }
}
